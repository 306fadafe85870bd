import { isStop, sleep } from '@bmaas/common';
import { ConnectionClosedError } from './errors.js';
import type { Session, SessionOptions } from './session.js';

/** Options of {@link runRounds}. Durations in milliseconds. */
export interface RoundsOptions {
  /** Stops the rounds: none starts once it aborted, and the round under way is handed it. */
  readonly signal: AbortSignal;
  /** Waits before each round: a rate limiter's token, or work to do. Rejects (or resolves) once `signal` aborts. */
  readonly before?: (signal: AbortSignal) => Promise<void>;
  /** Pause after each round, a polling interval; after a failed one, a second where this is 0. Default 0. */
  readonly interval?: number;
  /**
   * Reports what went wrong, in the loop's own words: a round that failed
   * (`round`; the next is tried), or the rounds' session that could not be
   * closed (`close`). Never a stop.
   */
  readonly onFailure: (error: unknown, during: 'round' | 'close') => void;
  /** For rounds that take a session: where it comes from, and its `processor` (metrics label). */
  readonly session?: {
    /** The BMDB connection (`BMDB`) the session is started from. */
    readonly bmdb: { startSession(options: SessionOptions): Promise<Session> };
    readonly processor: string;
  };
}

/** The pause after a failed round of a loop without an interval, so a failing database is not asked again at once. */
const FAILURE_PAUSE = 1_000;

/**
 * Runs `round` again and again until `options.signal` aborts: the loops of a
 * component that claim no work (a provisioner's passes, a status updater's,
 * a simulator's heartbeat rounds, a power sync's reads). Every such loop
 * keeps the same rules:
 *
 * - Stop: no round starts once the signal aborted; a round (or wait) that
 *   ends with a stop (`isStop`: the signal's reason, an abort) or with the
 *   BMDB closed under it (`ConnectionClosedError`) ends the loop quietly.
 * - Pause: `before` each round, `interval` after it (after a failed round,
 *   a second where there is no interval). A failed round is reported and
 *   the next one tried.
 * - Session (with `session`): each round gets a live session, started when
 *   there is none; a round that failed with its session no longer live has
 *   it closed and the next round starts another. The last one is closed when
 *   the loop ends; a failure to close is reported, never thrown.
 *
 * @example
 * ```ts
 * await runRounds(
 *   {
 *     signal,
 *     interval: 30_000,
 *     session: { bmdb, processor: 'inventory-sync' },
 *     onFailure: (error) => console.error(describeError(error)),
 *   },
 *   (session) => session.transact((q) => q.providedMachines('Inventory')),
 * );
 * ```
 */
export function runRounds(
  options: RoundsOptions & { readonly session: NonNullable<RoundsOptions['session']> },
  round: (session: Session) => Promise<unknown>,
): Promise<void>;
export function runRounds(
  options: RoundsOptions & { readonly session?: undefined },
  round: () => Promise<unknown>,
): Promise<void>;
export async function runRounds(options: RoundsOptions, round: (session: Session) => Promise<unknown>): Promise<void> {
  const { signal, before, interval = 0, onFailure, session: from } = options;
  let session: Session | undefined;
  const closeSession = async () => {
    const closing = session;
    session = undefined;
    await closing?.close().catch((error: unknown) => onFailure(error, 'close'));
  };
  try {
    while (!signal.aborted) {
      let pause = interval;
      try {
        await before?.(signal);
        if (signal.aborted) break;
        if (from !== undefined && session?.state !== 'live') {
          session = await from.bmdb.startSession({ processor: from.processor });
        }
        // Without a session, the round was given as taking none.
        await round(session as Session);
      } catch (error) {
        if (signal.aborted || isStop(error, signal) || error instanceof ConnectionClosedError) break;
        onFailure(error, 'round');
        if (session !== undefined && session.state !== 'live') await closeSession();
        if (pause === 0) pause = FAILURE_PAUSE;
      }
      if (pause > 0) await sleep(pause, signal).catch(() => undefined);
    }
  } finally {
    await closeSession();
  }
}
