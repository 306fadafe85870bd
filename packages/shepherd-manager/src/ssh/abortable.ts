import type { SshTarget } from '../ssh-client.js';
import { SshAbortedError } from './errors.js';
import { log } from './log.js';
import { describeTarget } from './target.js';

export /** Settles with `work`, or rejects with {@link SshAbortedError} (after `onAbort`) when `signal` fires first. */
async function abortable<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
  onAbort: () => void,
  target: SshTarget,
  operation: string,
): Promise<T> {
  if (!signal) return work;
  let listener: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    listener = () => {
      log('%s: %s aborted', describeTarget(target), operation);
      onAbort();
      reject(new SshAbortedError(target, operation, signal.reason));
    };
    if (signal.aborted) listener();
    else signal.addEventListener('abort', listener, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    if (listener) signal.removeEventListener('abort', listener);
  }
}

/** Runs `run`, handing what it throws to `onError`: ssh2 throws some failures and calls back with others. */
export function tryOrElse(onError: (error: unknown) => void, run: () => void): void {
  try {
    run();
  } catch (error) {
    onError(error);
  }
}
