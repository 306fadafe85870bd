import { setMaxListeners } from 'node:events';
import { describeError, isStop, sleep } from '@bmaas/common';
import type { Kysely } from 'kysely';
import type { Backoff } from './backoff.js';
import type { BMDB } from './connection.js';
import {
  BMDBError,
  ConnectionClosedError,
  NothingToDoError,
  ProcessMismatchError,
  SessionClosedError,
  SessionExpiredError,
  WorkConflictError,
  WorkEndedError,
  WorkLostError,
} from './errors.js';
import { detail, log } from './internal/log.js';
import { parseLimiter, type RateLimiter } from './limiter.js';
import type { Database } from './schema.js';
import type { Selection } from './selection.js';
import type { Session } from './session.js';
import type { Work } from './work.js';
import type { WorkCandidate } from './work-candidate.js';

/**
 * A BMDB control loop: which machines need work of a process, and what to do
 * with each. Run it with {@link runControlLoop}.
 */
export interface ControlLoop<T extends WorkCandidate> {
  /** Process name work is claimed under (e.g. `ShepherdAgentStart`). */
  readonly process: string;
  /** Metrics label for the loop's sessions (e.g. `shepherd-initializer`). Default the process. */
  readonly processor?: string;
  /**
   * Backoff applied when `processMachine` throws; a task may override it.
   * Default {@link DEFAULT_BACKOFF}: 1 minute, growing 1.2 times, up to 1 hour.
   */
  readonly defaultBackoff?: Backoff;
  /**
   * Machines ready for this loop, as a query: the runner claims from it in one
   * statement, and parallel workers skip machines another one is claiming
   * instead of conflicting on them. Give this or `getMachines`; this one is
   * faster. The selection must be for this loop's process (see
   * `selectionFor`); `runControlLoop` throws {@link ProcessMismatchError}
   * before starting otherwise.
   */
  selectMachines?(q: Kysely<Database>): Selection<T>;
  /**
   * Machines ready for this loop, at most `limit`, when there is no
   * `selectMachines`. Runs inside the claim's transaction; must exclude
   * machines under live work or backoff (see `hasLiveWork` and `inBackoff`).
   */
  getMachines?(q: Kysely<Database>, limit: number): Promise<readonly T[]>;
  /**
   * Processes one claimed machine. Call `task.work.finish(...)` on success;
   * throwing fails the work with `task.backoff` and the error as cause.
   * Returning without finishing ends the claim as canceled (`Canceled`).
   */
  processMachine(task: Task<T>): Promise<void>;
}

/** One claimed machine being processed by a control loop. */
export interface Task<T extends WorkCandidate> {
  /** The candidate claimed: the row the selection's `toCandidate` made, or what `getMachines` returned. */
  readonly candidate: T;
  /** The claim; finish it to record success. */
  readonly work: Work<T>;
  /** Backoff used if processing throws; starts as the loop's default. */
  backoff: Backoff;
  /** Aborts when the session expires or the stop grace period ends. */
  readonly signal: AbortSignal;
}

/** Options for {@link runControlLoop}. */
export interface ControlLoopOptions {
  /** Workers claiming and processing in parallel, each with its own session. Default 1. */
  readonly parallelism?: number;
  /** Limits claim attempts (shared by all workers). Default `parseLimiter('250ms,8')`. */
  readonly claimLimiter?: RateLimiter;
  /** Stops the loop: no new claims, then in-flight work ends or is cancelled. Default: never. */
  readonly signal?: AbortSignal;
  /** How long in-flight work may run on after the stop signal. Default 30 s. */
  readonly stopGracePeriod?: number;
  /**
   * Pause between claim attempts while there is nothing to do. Default 2 s.
   * Idle workers are woken when the database notifies that machines became
   * eligible (provided, released, agent or backoff removed); the pause bounds
   * how late time-based eligibility (a backoff running out, a heartbeat going
   * stale) is noticed. While notifications cannot be heard, idle workers look
   * again after 100 ms, doubling up to this.
   */
  readonly maxIdleDelay?: number;
  /** Heartbeat interval of the workers' sessions (ms). Default the connection's. */
  readonly sessionInterval?: number;
}

/** The backoff of a loop that names none: 1 minute, growing 1.2 times, up to 1 hour. */
export const DEFAULT_BACKOFF: Backoff = { initial: 60_000, maximum: 3_600_000, exponent: 1.2 };

/** The claim rate of a loop that names no limiter: 8 at once, then one every 250 ms. */
const DEFAULT_LIMITER = '250ms,8';

const FIRST_IDLE_DELAY = 100;
const ERROR_PAUSE = 1_000;

/**
 * Runs `loop` against the BMDB until `options.signal` aborts, then stops
 * cleanly: no new claims, in-flight work finishes (or is cancelled after the
 * grace period), and every session is closed, so nothing stays claimed.
 *
 * Each of `parallelism` workers holds a session (starting a new one when it
 * expires), waits on the rate limiter, claims one machine and processes it.
 * A worker sends its next claim as soon as its task's work starts to end
 * (finish, fail or cancel), so the end and the claim travel together; the
 * next task still starts only once the last `processMachine` returned, and
 * a machine claimed ahead when the loop stops is given back as `Canceled`.
 * Idle workers back off up to `maxIdleDelay` between attempts.
 */
export async function runControlLoop<T extends WorkCandidate>(
  bmdb: BMDB,
  loopOptions: ControlLoop<T>,
  options: ControlLoopOptions = {},
): Promise<void> {
  const loop = withDefaults(loopOptions);
  const parallelism = options.parallelism ?? 1;
  if (!Number.isInteger(parallelism) || parallelism < 1) {
    throw new RangeError(`control loop ${loop.processor}: parallelism must be a positive integer, got ${parallelism}`);
  }
  if (!loop.selectMachines && !loop.getMachines) {
    throw new BMDBError(`control loop ${loop.processor} has neither selectMachines nor getMachines`);
  }
  // Built once, for every worker: the query is immutable and its times are the database's now().
  const selection = loop.selectMachines?.(bmdb.db);
  if (selection && selection.process !== loop.process) throw new ProcessMismatchError(loop.process, selection.process);
  const signal = options.signal ?? new AbortController().signal;
  const limiter = options.claimLimiter ?? parseLimiter(DEFAULT_LIMITER);
  // Each worker listens for the stop at a few places at once (limiter, idle
  // wait, grace period): a signal of the runner's own, on which many
  // listeners are expected, rather than raising the caller's limit.
  const stop = new AbortController();
  setMaxListeners(0, stop.signal);
  const forward = () => stop.abort(signal.reason);
  if (signal.aborted) forward();
  else signal.addEventListener('abort', forward, { once: true });
  const runner = new Runner(bmdb, loop, selection, { ...options, signal: stop.signal, claimLimiter: limiter });
  detail.loop('%s: starting %d worker(s) for %s', loop.processor, parallelism, loop.process);
  try {
    await Promise.all(Array.from({ length: parallelism }, (_, index) => runner.worker(index)));
  } finally {
    signal.removeEventListener('abort', forward);
  }
  detail.loop('%s: stopped', loop.processor);
}

/** A loop with its defaults filled in. */
type CompleteLoop<T extends WorkCandidate> = ControlLoop<T> & {
  readonly processor: string;
  readonly defaultBackoff: Backoff;
};

function withDefaults<T extends WorkCandidate>(loop: ControlLoop<T>): CompleteLoop<T> {
  const { selectMachines, getMachines } = loop;
  return {
    process: loop.process,
    processor: loop.processor ?? loop.process,
    defaultBackoff: loop.defaultBackoff ?? DEFAULT_BACKOFF,
    ...(selectMachines && { selectMachines: (q: Kysely<Database>) => selectMachines.call(loop, q) }),
    ...(getMachines && { getMachines: (q: Kysely<Database>, limit: number) => getMachines.call(loop, q, limit) }),
    processMachine: (task) => loop.processMachine(task),
  };
}

/** The options a runner works with: the caller's, with the signal and limiter settled. */
type RunnerOptions = ControlLoopOptions & { readonly signal: AbortSignal; readonly claimLimiter: RateLimiter };

class Runner<T extends WorkCandidate> {
  readonly #stopGracePeriod: number;
  readonly #maxIdleDelay: number;

  constructor(
    private readonly bmdb: BMDB,
    private readonly loop: CompleteLoop<T>,
    private readonly selection: Selection<T> | undefined,
    private readonly options: RunnerOptions,
  ) {
    this.#stopGracePeriod = options.stopGracePeriod ?? 30_000;
    this.#maxIdleDelay = options.maxIdleDelay ?? 2_000;
  }

  /**
   * Waits for the limiter and claims one machine. Never rejects: what went
   * wrong is the outcome, with the change generation seen before the claim
   * (so an idle wait wakes for any change after it). With a token at hand
   * the claim is handed to its batch at once, before the caller goes on.
   */
  #nextClaim(session: Session): Promise<ClaimOutcome<T>> {
    const limiter = this.options.claimLimiter;
    if (limiter.tryTake()) return this.#claim(session);
    const generation = this.bmdb.machineChanges.generation;
    return limiter.wait(this.options.signal).then(
      () => this.#claim(session),
      (error: unknown) => ({ error, generation }),
    );
  }

  /** Claims one machine, from the loop's selection if it has one; never rejects. */
  async #claim(session: Session): Promise<ClaimOutcome<T>> {
    const generation = this.bmdb.machineChanges.generation;
    const { process, getMachines } = this.loop;
    try {
      if (this.selection) return { work: await session.work(process, this.selection), generation };
      if (!getMachines) throw new BMDBError(`control loop ${this.loop.processor} has no getMachines`);
      return { work: await session.work(process, (q) => getMachines.call(this.loop, q, 1)), generation };
    } catch (error) {
      return { error, generation };
    }
  }

  async worker(index: number): Promise<void> {
    const { signal } = this.options;
    const name = `${this.loop.processor}#${index}`;
    let session: Session | undefined;
    let idleDelay = FIRST_IDLE_DELAY;
    const changes = this.bmdb.machineChanges;
    // The next claim, sent while the last work's end is on its way: a
    // worker's end and its next claim overlap (as a job queue completes a
    // job while fetching the next), and the next task still starts only
    // after the last one returned.
    let ahead: Promise<ClaimOutcome<T>> | undefined;
    try {
      while (!signal.aborted) {
        if (session?.state !== 'live') {
          await cancelAhead(ahead, name);
          ahead = undefined;
          session = await this.#startSession(name, signal);
          if (!session) break;
        }
        const outcome = await (ahead ?? this.#nextClaim(session));
        ahead = undefined;
        if (!('work' in outcome)) {
          const { error } = outcome;
          if (isStop(error, signal)) break;
          if (error instanceof NothingToDoError) {
            // While notifications are heard, polling only has to notice what
            // no statement announces (backoffs and heartbeats aging), and a
            // worker that polls often would spend the limiter's tokens that
            // a notified claim then waits for.
            if (changes.listening) idleDelay = this.#maxIdleDelay;
            await changes.wait(outcome.generation, idleDelay, signal);
            idleDelay = Math.min(idleDelay * 2, this.#maxIdleDelay);
          } else if (error instanceof WorkConflictError) {
            log.loop('%s: %s', name, error.message);
          } else if (error instanceof SessionExpiredError || error instanceof SessionClosedError) {
            log.loop('%s: %s; starting a new session', name, error.message);
            session = undefined;
          } else if (error instanceof ConnectionClosedError) {
            break;
          } else {
            log.loop('%s: claiming work for %s failed: %s', name, this.loop.process, describeError(error));
            await sleep(ERROR_PAUSE, signal);
          }
          continue;
        }
        const { work } = outcome;
        idleDelay = FIRST_IDLE_DELAY;
        // One machine was there; there may be more: wake an idle colleague.
        changes.wakeOne();
        const holder = session;
        void work.ending.then(() => {
          if (!signal.aborted && holder.state === 'live') ahead = this.#nextClaim(holder);
        });
        await this.#process(name, session, work);
      }
    } catch (error) {
      if (!isStop(error, signal)) throw error;
    } finally {
      await cancelAhead(ahead, name);
      await session?.close().catch((error) => log.loop('%s: closing session failed: %s', name, describeError(error)));
    }
  }

  /** A new session, retried while the database is unreachable; undefined once stopped. */
  async #startSession(name: string, signal: AbortSignal): Promise<Session | undefined> {
    while (!signal.aborted) {
      try {
        return await this.bmdb.startSession({
          processor: this.loop.processor,
          ...(this.options.sessionInterval !== undefined && { interval: this.options.sessionInterval }),
        });
      } catch (error) {
        if (error instanceof ConnectionClosedError) return undefined;
        log.loop('%s: starting a session failed: %s', name, describeError(error));
        await sleep(ERROR_PAUSE, signal);
      }
    }
    return undefined;
  }

  /**
   * Processes one claim to its end. After a stop signal, the task gets the
   * grace period; then its signal aborts and the claim is ended without
   * waiting further.
   */
  async #process(name: string, session: Session, work: Work<T>): Promise<void> {
    const grace = new GracePeriod(this.#stopGracePeriod);
    const task = newTask(work, this.loop.defaultBackoff, session.signal, grace);
    const processing = this.#runTask(name, task);

    const { signal } = this.options;
    const startGrace = () => grace.start();
    signal.addEventListener('abort', startGrace, { once: true });
    if (signal.aborted) startGrace();
    try {
      await Promise.race([processing, grace.ended]);
    } finally {
      signal.removeEventListener('abort', startGrace);
      grace.dispose();
    }
    if (grace.over) {
      log.loop('%s: machine %s still processing after the grace period; releasing it', name, work.machineId);
    }
    await cancel(work, name);
  }

  async #runTask(name: string, task: Task<T>): Promise<void> {
    const { work } = task;
    try {
      await this.loop.processMachine(task);
    } catch (error) {
      const cause = describeError(error);
      if (work.state !== 'active') {
        log.loop('%s: processing machine %s failed after its work ended: %s', name, work.machineId, cause);
        return;
      }
      // The failure's own line (with its backoff) comes from work.fail.
      detail.loop('%s: processing machine %s failed', name, work.machineId);
      await work.fail(task.backoff, cause).catch((failError) => {
        if (!isSessionGone(failError)) {
          log.loop('%s: recording failure of machine %s failed: %s', name, work.machineId, describeError(failError));
        }
      });
    }
  }
}

/** A claim attempt's result: the work, or why there is none. */
type ClaimOutcome<T extends WorkCandidate> =
  | { readonly work: Work<T>; readonly generation: number }
  | { readonly error: unknown; readonly generation: number };

/** Cancels a machine claimed ahead that no task will process (the loop stopped or its session ended). */
async function cancelAhead<T extends WorkCandidate>(
  ahead: Promise<ClaimOutcome<T>> | undefined,
  name: string,
): Promise<void> {
  const outcome = await ahead;
  if (outcome && 'work' in outcome) await cancel(outcome.work, name);
}

/** Cancels `work` unless it ended already; a failure other than the session's own end is logged. */
async function cancel(work: Work, name: string): Promise<void> {
  await work.cancel().catch((error) => {
    if (!isSessionGone(error))
      log.loop('%s: releasing machine %s failed: %s', name, work.machineId, describeError(error));
  });
}

function isSessionGone(error: unknown): boolean {
  return (
    error instanceof SessionExpiredError ||
    error instanceof SessionClosedError ||
    error instanceof WorkLostError ||
    error instanceof WorkEndedError ||
    error instanceof ConnectionClosedError
  );
}

/**
 * The time a task may run on after the loop was told to stop. Its abort
 * signal is made only when a task asks for it: most tasks of a busy loop end
 * without looking, and making one costs more than a short task itself.
 */
class GracePeriod {
  #controller: AbortController | undefined;
  #timer: NodeJS.Timeout | undefined;
  #reason: Error | undefined;
  #end: () => void = () => {};
  /** Resolves when the grace period ends; never rejects. */
  readonly ended = new Promise<void>((resolve) => {
    this.#end = resolve;
  });

  constructor(private readonly duration: number) {}

  /** Whether the grace period ran out. */
  get over(): boolean {
    return this.#reason !== undefined;
  }

  /** Aborts when the grace period ends. */
  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#reason) this.#controller.abort(this.#reason);
    }
    return this.#controller.signal;
  }

  /** Starts counting down; idempotent. */
  start(): void {
    this.#timer ??= setTimeout(() => {
      this.#reason = new Error(`control loop stopped; grace period of ${this.duration}ms ended`);
      this.#controller?.abort(this.#reason);
      this.#end();
    }, this.duration);
  }

  dispose(): void {
    clearTimeout(this.#timer);
  }
}

/** A task whose signal (session or grace period ending) is made on first use. */
function newTask<T extends WorkCandidate>(
  work: Work<T>,
  backoff: Backoff,
  sessionSignal: AbortSignal,
  grace: GracePeriod,
): Task<T> {
  let signal: AbortSignal | undefined;
  return {
    candidate: work.candidate,
    work,
    backoff,
    get signal() {
      signal ??= AbortSignal.any([sessionSignal, grace.signal]);
      return signal;
    },
  };
}
