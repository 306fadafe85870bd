/** Polls `check` every `every` ms until it returns something other than undefined; fails after `timeout`. */
export async function eventually<T>(check: () => Promise<T | undefined>, timeout = 20_000, every = 50): Promise<T> {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeout} ms`);
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
