import { setTimeout as delay } from 'node:timers/promises';

/** Waits `ms` milliseconds; rejects with the signal's reason as soon as it aborts. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  try {
    await delay(Math.max(0, ms), undefined, { signal });
  } catch (error) {
    if (signal?.aborted) throw signal.reason;
    throw error;
  }
}

/** Whether `error` is `signal`'s abort reason, i.e. the caller stopped us rather than a failure. */
export function isAbortOf(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && error === signal.reason;
}
