import { setTimeout as delay } from 'node:timers/promises';
import createDebug from 'debug';

/** Loggers under `shepherd:*`; each line names the machine and provider IDs involved. */
export const log = {
  provisioner: createDebug('shepherd:provisioner'),
  initializer: createDebug('shepherd:initializer'),
  recoverer: createDebug('shepherd:recoverer'),
};

/** Waits `ms`, rejecting with the signal's reason as soon as it aborts. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  try {
    await delay(ms, undefined, { signal });
  } catch (error) {
    throw signal?.aborted ? signal.reason : error;
  }
}

/** Whether `error` is `signal`'s abort rather than a failure. */
export function isAbort(error: unknown, signal?: AbortSignal): boolean {
  return (
    (signal?.aborted === true && error === signal.reason) || (error instanceof Error && error.name === 'AbortError')
  );
}
