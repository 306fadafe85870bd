import { performance } from 'node:perf_hooks';
import type { Kysely } from 'kysely';
import type pg from 'pg';
import {
  BMDBError,
  NothingToDoError,
  ProcessMismatchError,
  SessionClosedError,
  SessionExpiredError,
  WorkConflictError,
  type WorkOutcome,
} from './errors.js';
import { connectionLoss, describeConnectionLoss, isConnectionLost } from './internal/connection-lost.js';
import type { Ends } from './internal/ends.js';
import { describeError, detail, log } from './internal/log.js';
import { withRetry } from './internal/retry.js';
import { retryMetrics } from './internal/retry-metrics.js';
import type { SelectionClaims } from './internal/selection-claims.js';
import { reportHeartbeatFailure } from './internal/session-heartbeat.js';
import type { BMDBMetrics } from './metrics.js';
import { Queries } from './queries.js';
import type { Database } from './schema.js';
import { isSelection, type Selection, type SelectionRow } from './selection.js';
import { type ClaimStatus, claimMachineStatement, type MachineClaimStatus } from './sql/claim.js';
import { closeSessionStatement, renewSessionDeadline, sessionAlive } from './sql/sessions.js';
import { Work } from './work.js';
import type { WorkCandidate } from './work-candidate.js';

/** Options for `BMDB.startSession`. */
export interface SessionOptions {
  /**
   * The component role this session works for (`shepherd-initializer`, ...),
   * used as the `processor` metrics label. Default `unknown`.
   */
  readonly processor?: string;
  /**
   * How long the session survives without a heartbeat, in milliseconds (whole
   * seconds, at least 1 s). Heartbeats go out every half interval. Default
   * the connection's `sessionInterval` (5 s).
   */
  readonly interval?: number;
}

/** Where a session stands: `live` until it expires or is closed, for good. */
export type SessionState = 'live' | 'expired' | 'closed';

/**
 * @internal What the sessions of one BMDB connection, and their work, go
 * through: the connection's own parts, one set shared by all its sessions.
 */
export interface SessionParts {
  readonly db: Kysely<Database>;
  /** Claims from selections, batched across sessions (one statement at READ COMMITTED; see sql/claim.ts). */
  readonly claims: SelectionClaims;
  /** Ends of work without a caller's transaction, batched across sessions. */
  readonly ends: Ends;
  /** A small pool of its own, so heartbeats never queue behind work. */
  readonly heartbeatPool: pg.Pool;
  readonly metrics: BMDBMetrics | undefined;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Fresh tries when concurrent claims took every candidate, before giving up with a conflict. */
const CONTENDED_ATTEMPTS = 5;

interface Claim<T> {
  readonly machineId: string;
  readonly candidate: T;
  readonly tookOverFrom: string | null;
  readonly previousBackoffSeconds: number | undefined;
}

function toClaim<T>(status: ClaimStatus | MachineClaimStatus, machineId: string, candidate: T): Claim<T> {
  return {
    machineId,
    candidate,
    tookOverFrom: status.bmdb_took_over_from,
    previousBackoffSeconds: status.bmdb_last_interval_seconds ?? undefined,
  };
}

/**
 * A worker's presence in the BMDB: a row with a deadline that heartbeats keep
 * pushing forward. Work is claimed through a session, and ended when the
 * session closes or expires, so a crashed worker's machines come free again.
 *
 * Once the deadline passes (heartbeats could not reach the database for a
 * whole interval), the session is expired for good: {@link Session.signal}
 * aborts and every call fails with {@link SessionExpiredError}.
 */
export class Session {
  #state: SessionState = 'live';
  /** performance.now() after which the database certainly considers us dead. */
  #localDeadline: number;
  #nextHeartbeat: NodeJS.Timeout | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  readonly #abort = new AbortController();
  /** Set once the session is being given up: it takes no new work, and expires once its ends under way settle. */
  #givingUp: SessionExpiredError | undefined;
  readonly #works = new Set<Work>();
  readonly #labels: { processor: string };

  /** @internal A session `BMDB.startSession` inserted. */
  static started(parts: SessionParts, id: string, processor: string, interval: number, startedAt: number): Session {
    return new Session(parts, id, processor, interval, startedAt);
  }

  // Private: only `BMDB.startSession` makes sessions (through `started`).
  private constructor(
    private readonly parts: SessionParts,
    /** The session's ID (its row in `sessions`). */
    readonly id: string,
    /** The metrics label this session was started with. */
    readonly processor: string,
    /** Heartbeat deadline interval, in milliseconds. */
    readonly interval: number,
    startedAt: number,
  ) {
    this.#labels = { processor };
    this.#localDeadline = startedAt + interval;
    this.#armWatchdog();
    this.#scheduleHeartbeat(interval / 2);
  }

  /** Aborts when the session expires or closes; hand it to work done in its name. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** `live`, `expired` (deadline passed) or `closed` (by its owner). */
  get state(): SessionState {
    this.#checkDeadline();
    return this.#state;
  }

  /**
   * Runs `fn` in one database transaction at the connection's isolation level
   * (SERIALIZABLE by default), after checking the session is alive. Retries the
   * whole transaction on serialization failures and deadlocks, so `fn` must be
   * safe to run more than once.
   *
   * @throws {@link SessionExpiredError} if the session expired
   */
  async transact<T>(fn: (q: Queries) => Promise<T>): Promise<T> {
    this.assertLive();
    return this.#transaction(async (trx) => {
      await this.#checkAliveIn(trx);
      return fn(new Queries(trx));
    });
  }

  /**
   * Claims work on one machine for `process`, in one of two ways:
   *
   * - With a `retriever` function, in one transaction: the retriever returns
   *   candidates (machine IDs, or rows with a `machineId`) and the first is
   *   claimed.
   * - With a {@link Selection}, in one statement and one round trip: the
   *   first of the selection's machines that no concurrent claim holds is
   *   claimed. Prefer this when several workers claim from the same
   *   selection.
   *
   * Either way `Started` is recorded and the pair's previous backoff interval
   * is remembered for {@link Work.fail}. A claim left behind by an expired
   * session is taken over (its history gets a `Canceled` event).
   *
   * @throws {@link NothingToDoError} when there is no candidate
   * @throws {@link WorkConflictError} when live sessions hold the candidates
   * @throws {@link SessionExpiredError} if the session expired
   * @throws {@link ProcessMismatchError} for a selection of another process
   */
  async work<T extends WorkCandidate>(
    process: string,
    retriever: (q: Queries) => Promise<readonly T[]>,
  ): Promise<Work<T>>;
  async work<T extends WorkCandidate, R extends SelectionRow>(
    process: string,
    selection: Selection<T, R>,
  ): Promise<Work<T>>;
  async work<T extends WorkCandidate>(
    process: string,
    source: ((q: Queries) => Promise<readonly T[]>) | Selection<T>,
  ): Promise<Work<T>> {
    if (isSelection<T>(source) && source.process !== process) throw new ProcessMismatchError(process, source.process);
    this.assertLive();
    let claim: Claim<T>;
    try {
      claim = isSelection<T>(source)
        ? await this.#claimSelected(process, source)
        : await this.#claimRetrieved(process, source);
    } catch (error) {
      if (!isConnectionLost(error)) throw error;
      // The claim may have committed with nobody to know of it: a claim the
      // session would hold for as long as it lives. Give the session up; the
      // database ends what it holds within one interval.
      const loss = connectionLoss(error);
      throw this.#giveUp(
        `the connection was lost during a claim for ${process} (${loss ? `${describeConnectionLoss(loss)}: ` : ''}${describeError(error)})`,
      );
    }
    const work = Work.claimed(
      this,
      this.parts,
      claim.machineId,
      process,
      claim.candidate,
      claim.previousBackoffSeconds,
    );
    this.#works.add(work as Work);
    this.parts.metrics?.workStarted.inc({ ...this.#labels, process });
    detail.work(
      'session %s claimed machine %s for %s%s',
      this.id,
      claim.machineId,
      process,
      claim.tookOverFrom ? ` (taken over from expired session ${claim.tookOverFrom})` : '',
    );
    return work;
  }

  /**
   * Ends the session: cancels its live work (recording `Canceled`), deletes
   * its row and aborts {@link Session.signal}. Idempotent; also tidies up
   * after an expired session.
   */
  async close(): Promise<void> {
    if (this.#state === 'closed') return;
    const wasExpired = this.#state === 'expired';
    this.#enter('closed', new SessionClosedError(this.id));
    for (const work of this.#works) work.endedWithSession('canceled');
    this.#works.clear();
    const { rows } = await withRetry(
      () => closeSessionStatement(this.id).execute(this.parts.db),
      retryMetrics(this.parts.metrics, [this.processor]),
    );
    detail.session(
      'session %s closed%s, %d claim(s) released',
      this.id,
      wasExpired ? ' after expiring' : '',
      rows[0]?.work ?? 0,
    );
  }

  /**
   * @internal Throws SessionExpiredError / SessionClosedError unless the
   * session is live (and not being given up); its work checks before an end.
   */
  assertLive(): void {
    if (this.#givingUp) throw this.#givingUp;
    const state = this.state;
    if (state === 'closed') throw new SessionClosedError(this.id);
    if (state === 'expired') throw this.#abort.signal.reason as SessionExpiredError;
  }

  async #checkAliveIn(trx: Kysely<Database>): Promise<void> {
    if (!(await sessionAlive(trx, this.id))) {
      this.#expire('its deadline passed in the database');
      throw this.#abort.signal.reason as SessionExpiredError;
    }
  }

  /** A retriever's first candidate, claimed in the retriever's transaction. */
  async #claimRetrieved<T extends WorkCandidate>(
    process: string,
    retriever: (q: Queries) => Promise<readonly T[]>,
  ): Promise<Claim<T>> {
    return this.#transaction(async (trx) => {
      const candidates = await retriever(new Queries(trx));
      const candidate = candidates[0];
      if (candidate === undefined) throw new NothingToDoError(process);
      const machineId = typeof candidate === 'string' ? candidate : candidate.machineId;
      if (!UUID.test(machineId)) {
        throw new BMDBError(
          `work retriever for process ${process} returned ${JSON.stringify(machineId)}, not a machine ID`,
        );
      }
      const { rows } = await claimMachineStatement(this.id, process, machineId).execute(trx);
      const status = this.#checkClaim(rows[0], process);
      if (status.bmdb_exists === 0) {
        throw new BMDBError(
          `work retriever for process ${process} returned machine ${machineId}, which does not exist`,
        );
      }
      if (!status.bmdb_claimed) throw new WorkConflictError(machineId, process);
      return toClaim(status, machineId, candidate);
    });
  }

  /**
   * A selection's machine, claimed by one statement at READ COMMITTED (see
   * sql/claim.ts for why that is exclusive), shared with the concurrent claims of
   * other sessions from the same selection. When every candidate was taken by
   * concurrent claims, the claim runs again on a fresh snapshot.
   */
  async #claimSelected<T extends WorkCandidate, R extends SelectionRow>(
    process: string,
    selection: Selection<T, R>,
  ): Promise<Claim<T>> {
    for (let attempt = 1; ; attempt++) {
      const status = this.#checkClaim(
        await this.parts.claims.claim(this.id, this.processor, process, selection.query),
        process,
      );
      if (status.bmdb_claimed && status.machine_id !== null) {
        const row = status as unknown as R;
        return toClaim(status, status.machine_id, selection.toCandidate(row));
      }
      if (status.bmdb_found === 0) throw new NothingToDoError(process);
      if (attempt >= CONTENDED_ATTEMPTS) {
        throw new WorkConflictError(status.bmdb_first_candidate ?? 'unknown', process);
      }
    }
  }

  /** Throws SessionExpiredError unless the claim statement found the session alive. */
  #checkClaim<S extends { readonly bmdb_live: boolean }>(status: S | undefined, process: string): S {
    if (!status) throw new BMDBError(`claim for process ${process} returned no row`);
    if (!status.bmdb_live) {
      this.#expire('its deadline passed in the database');
      throw this.#abort.signal.reason as SessionExpiredError;
    }
    return status;
  }

  /** @internal Bookkeeping once a work item of this session ended: it is counted and forgotten. */
  workEnded(work: Work, outcome: WorkOutcome): void {
    this.#works.delete(work);
    this.parts.metrics?.workEnded({ ...this.#labels, process: work.process }, outcome);
  }

  /** A retried transaction at the connection's isolation level. */
  #transaction<T>(fn: (trx: Kysely<Database>) => Promise<T>): Promise<T> {
    return withRetry(() => this.parts.db.transaction().execute(fn), retryMetrics(this.parts.metrics, [this.processor]));
  }

  #scheduleHeartbeat(delay: number): void {
    this.#nextHeartbeat = setTimeout(() => void this.#heartbeat(), delay);
    this.#nextHeartbeat.unref();
  }

  /** Expires the session when the deadline passes without a successful heartbeat. */
  #armWatchdog(): void {
    clearTimeout(this.#watchdog);
    const untilDeadline = Math.max(0, this.#localDeadline - performance.now());
    this.#watchdog = setTimeout(() => this.#checkDeadline(), untilDeadline + 1);
    this.#watchdog.unref();
  }

  /** Pushes the session's deadline in the database one interval out. */
  async #heartbeat(): Promise<void> {
    if (this.#state !== 'live') return;
    const sentAt = performance.now();
    this.parts.metrics?.heartbeats.inc(this.#labels);
    let renewed: boolean;
    try {
      renewed = await renewSessionDeadline(this.parts.heartbeatPool, this.id);
    } catch (error) {
      if (this.#state !== 'live') return;
      const left = this.#localDeadline - performance.now();
      const failure = { sessionId: this.id, processor: this.processor, interval: this.interval, left, error };
      const retryIn = reportHeartbeatFailure(failure, this.parts.metrics);
      // Transient: keep trying until the deadline has really passed.
      if (this.state === 'live') this.#scheduleHeartbeat(retryIn);
      return;
    }
    if (this.#state !== 'live') return;
    if (!renewed) {
      this.#expire('its deadline passed in the database');
      return;
    }
    // The database's new deadline is at least this far out: it counted from
    // a moment after we sent the heartbeat.
    this.#localDeadline = sentAt + this.interval;
    this.#armWatchdog();
    this.#scheduleHeartbeat(this.interval / 2);
  }

  /**
   * Gives the session up: no new work from now on; once the ends of work
   * already on their way have settled (an uncertain claim must not cost an
   * end that can still be recorded, nor make its work be done again), the
   * session expires and is closed. Its row expires on its own if that fails.
   */
  #giveUp(why: string): SessionExpiredError {
    this.#givingUp ??= new SessionExpiredError(this.id, why);
    const expireAndClose = () => {
      this.#expire(why);
      this.close().catch((error) =>
        log.session('closing abandoned session %s failed: %s', this.id, describeError(error)),
      );
    };
    const ending = [...this.#works].flatMap((work) => work.endUnderWay ?? []);
    if (ending.length === 0) expireAndClose();
    else void Promise.allSettled(ending).then(expireAndClose);
    return this.#givingUp;
  }

  #checkDeadline(): void {
    if (this.#state === 'live' && performance.now() >= this.#localDeadline) {
      this.#expire('heartbeats did not reach the database before the deadline');
    }
  }

  #expire(why: string): void {
    if (this.#state !== 'live') return;
    log.session('session %s expired: %s', this.id, why);
    this.#enter('expired', new SessionExpiredError(this.id, why));
    for (const work of this.#works) work.endedWithSession('lost');
    this.#works.clear();
  }

  /** Leaves `live` for good: no more heartbeats, and the session's signal aborts with `reason`. */
  #enter(state: 'expired' | 'closed', reason: Error): void {
    this.#state = state;
    clearTimeout(this.#nextHeartbeat);
    clearTimeout(this.#watchdog);
    this.#abort.abort(reason);
  }
}
