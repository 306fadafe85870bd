/** How long start-up steps abandoned on a stop signal may take to end on their own. */
export const ABANDONED_GRACE = 1_000;

export async function settledWithin(steps: Promise<unknown>[], ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.allSettled(steps),
    new Promise((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

/** A stop signal came before the shepherd was running. */
export class StartupStopped extends Error {
  override name = 'StartupStopped';
  constructor() {
    super('stopped during start-up');
  }
}

/**
 * `step`, or a {@link StartupStopped} as soon as `signal` aborts (calling
 * `onAbandon`). What the step was waiting for (a file read, a directory
 * created, an HTTP request) is abandoned: a file system that never answers
 * must not keep the process.
 */
export function raceSignal<T>(step: Promise<T>, signal: AbortSignal, onAbandon: () => void): Promise<T> {
  if (signal.aborted) {
    onAbandon();
    return Promise.reject(new StartupStopped());
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      onAbandon();
      reject(new StartupStopped());
    };
    signal.addEventListener('abort', onAbort, { once: true });
    step.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error);
      },
    );
  });
}
