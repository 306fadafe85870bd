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
