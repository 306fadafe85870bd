/**
 * Polls `check` every `every` ms (default 50) until it returns something
 * other than undefined, and returns that; fails after `timeout` ms (default
 * 20 s), naming `what` the test waited for when given. The suite's one way
 * to wait: for a condition, never for a fixed time.
 */
export function eventually<T>(check: () => Promise<T | undefined>, timeout?: number): Promise<T>;
export function eventually<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeout?: number,
  every?: number,
): Promise<T>;
export async function eventually<T>(
  ...args: [() => Promise<T | undefined>, number?] | [string, () => Promise<T | undefined>, number?, number?]
): Promise<T> {
  const [what, check, timeout = 20_000, every = 50]: [string, () => Promise<T | undefined>, number?, number?] =
    typeof args[0] === 'string'
      ? (args as [string, () => Promise<T | undefined>, number?, number?])
      : ['condition', ...(args as [() => Promise<T | undefined>, number?])];
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not met within ${timeout} ms`);
    await new Promise((resolve) => setTimeout(resolve, every));
  }
}

/**
 * Runs `run` (a control loop, say; it gets the stop signal) until `done`
 * holds, then stops it and waits for its clean end, whatever happened. Fails
 * at once if the loop ends before the condition holds.
 */
export async function runUntil(
  run: (signal: AbortSignal) => Promise<unknown>,
  done: () => Promise<boolean>,
  options: { timeout?: number; what?: string } = {},
): Promise<void> {
  const { timeout = 20_000, what = 'loop' } = options;
  const stop = new AbortController();
  let ended = false;
  const running = run(stop.signal).finally(() => {
    ended = true;
  });
  try {
    await eventually(async () => {
      if (await done()) return true;
      if (ended) throw new Error(`${what}: ended before the condition held`);
      return undefined;
    }, timeout);
  } finally {
    stop.abort();
    await running;
  }
}
