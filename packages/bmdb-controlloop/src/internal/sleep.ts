import { setTimeout as delay } from 'node:timers/promises';

/**
 * Waits `ms` milliseconds. Rejects with the signal's reason as soon as the
 * signal aborts, so a stopping control loop never sits out a long wait.
 *
 * @example
 * ```ts
 * await sleep(30_000, signal); // throws signal.reason once signal aborts
 * ```
 */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  try {
    await delay(Math.max(0, ms), undefined, { signal });
  } catch (error) {
    if (signal?.aborted) throw signal.reason;
    throw error;
  }
}

/** Whether `error` is the result of an aborted signal rather than a failure. */
export function isAbort(error: unknown, signal?: AbortSignal): boolean {
  if (signal?.aborted && error === signal.reason) return true;
  return error instanceof Error && (error.name === 'AbortError' || error.name === 'TimeoutError');
}
