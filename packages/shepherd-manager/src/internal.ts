import { setTimeout as delay } from 'node:timers/promises';
import type { Queries, Task, WorkCandidate } from '@bmaas/bmdb-controlloop';
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

/** Node's network errors on a connection that could not be made or was cut. */
const NETWORK_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);
/** SQLSTATEs of a server going away: shutdown, crash, starting up, too many connections. */
const SERVER_GONE = new Set(['57P01', '57P02', '57P03', '53300']);

/**
 * Whether `error` says the database could not be reached or the connection
 * was lost, rather than anything about the statement: trying again once the
 * database is back may well work.
 */
export function isDatabaseUnreachable(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // Class 08: connection exception.
    return NETWORK_ERRORS.has(code) || SERVER_GONE.has(code) || code.startsWith('08');
  }
  // node-postgres reports a cut connection without a code.
  return /^Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/.test(
    error.message,
  );
}

const RECORD_RETRY_FIRST = 100;
const RECORD_RETRY_MAX = 1_000;

/**
 * Finishes `task` with `fn` once the work on the machine is done (the agent
 * runs, the reboot was asked for), retrying while the database is
 * unreachable. Failing the claim instead would back the machine off and do the
 * work again later, for nothing but a database restart. Retries end when the
 * task's signal aborts (its session expired, or the loop stopped and the grace
 * period ran out): the claim is then released by the BMDB and the machine
 * processed again, so across an outage longer than the session, work is done
 * at least once rather than exactly once.
 *
 * A retry that finds the claim gone (`WorkLostError`) after an attempt whose
 * commit was cut off may mean the attempt did commit; that error is thrown
 * as it is, and the runner, seeing the work ended, records nothing more.
 */
export async function finishDone<T extends WorkCandidate>(
  task: Task<T>,
  fn: (q: Queries) => Promise<void>,
  logger: (format: string, ...args: unknown[]) => void,
): Promise<void> {
  let pause = RECORD_RETRY_FIRST;
  for (let attempt = 1; ; attempt++) {
    try {
      await task.work.finish(fn);
      if (attempt > 1) logger('machine %s: recorded on attempt %d, the database is back', task.work.machineId, attempt);
      return;
    } catch (error) {
      if (!isDatabaseUnreachable(error) || task.signal.aborted) throw error;
      logger(
        'machine %s: done, but the BMDB cannot record it (%s); retrying in %d ms',
        task.work.machineId,
        error instanceof Error ? error.message : String(error),
        pause,
      );
      try {
        await sleep(pause, task.signal);
      } catch {
        throw error;
      }
      pause = Math.min(pause * 2, RECORD_RETRY_MAX);
    }
  }
}
