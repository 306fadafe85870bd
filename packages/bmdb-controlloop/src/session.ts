import { performance } from 'node:perf_hooks';
import { describeError, isUuid } from '@bmaas/common';
import type { Kysely } from 'kysely';
import {
  BMDBError,
  NothingToDoError,
  ProcessMismatchError,
  type SessionExpiredError,
  WorkConflictError,
} from './errors.js';
import { connectionLoss, describeConnectionLoss, isConnectionLost } from './internal/connection-lost.js';
import { detail, log } from './internal/log.js';
import { withRetry } from './internal/retry.js';
import { retryMetrics } from './internal/retry-metrics.js';
import { reportHeartbeatFailure } from './internal/session-heartbeat.js';
import type { Database } from './schema.js';
import { isSelection, type Selection, type SelectionRow } from './selection.js';
import { SessionLife, type SessionState } from './session-life.js';
import type { SessionParts } from './session-parts.js';
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

export type { SessionState } from './session-life.js';

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
  /** Where the session stands; its work asks it too. */
  readonly #life: SessionLife;
  #nextHeartbeat: NodeJS.Timeout | undefined;
  #watchdog: NodeJS.Timeout | undefined;
  /** The work the session holds; each removes itself once ended. */
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
    this.#life = new SessionLife(id, processor, interval, startedAt);
    // Expired or closed, for good: no more heartbeats, and its work ended with it.
    this.#life.signal.addEventListener('abort', () => this.#ended(), { once: true });
    this.#armWatchdog();
    this.#scheduleHeartbeat(interval / 2);
  }

  /** Aborts when the session expires or closes; hand it to work done in its name. */
  get signal(): AbortSignal {
    return this.#life.signal;
  }

  /** `live`, `expired` (deadline passed) or `closed` (by its owner). */
  get state(): SessionState {
    return this.#life.state;
  }

  /**
   * Runs `fn` in one database transaction at the connection's isolation level
   * (SERIALIZABLE by default), after checking the session is alive. Retries the
   * whole transaction on serialization failures and deadlocks, so `fn` must be
   * safe to run more than once.
   *
   * @throws {@link SessionExpiredError} if the session expired
   */
  async transact<T>(fn: (q: Kysely<Database>) => Promise<T>): Promise<T> {
    this.assertLive();
    return this.#transaction(async (trx) => {
      await this.#checkAliveIn(trx);
      return fn(trx);
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
    retriever: (q: Kysely<Database>) => Promise<readonly T[]>,
  ): Promise<Work<T>>;
  async work<T extends WorkCandidate, R extends SelectionRow>(
    process: string,
    selection: Selection<T, R>,
  ): Promise<Work<T>>;
  async work<T extends WorkCandidate>(
    process: string,
    source: ((q: Kysely<Database>) => Promise<readonly T[]>) | Selection<T>,
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
      this.#life,
      this.parts,
      this.#works as Set<Work<T>>,
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
    if (this.#life.recordedState === 'closed') return;
    const wasExpired = this.#life.recordedState === 'expired';
    this.#life.close();
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
    this.#life.assertLive();
  }

  async #checkAliveIn(trx: Kysely<Database>): Promise<void> {
    if (!(await sessionAlive(trx, this.id))) {
      this.#life.expire('its deadline passed in the database');
      throw this.#life.reason as SessionExpiredError;
    }
  }

  /** A retriever's first candidate, claimed in the retriever's transaction. */
  async #claimRetrieved<T extends WorkCandidate>(
    process: string,
    retriever: (q: Kysely<Database>) => Promise<readonly T[]>,
  ): Promise<Claim<T>> {
    return this.#transaction(async (trx) => {
      const candidates = await retriever(trx);
      const candidate = candidates[0];
      if (candidate === undefined) throw new NothingToDoError(process);
      const machineId = typeof candidate === 'string' ? candidate : candidate.machineId;
      if (!isUuid(machineId)) {
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
      this.#life.expire('its deadline passed in the database');
      throw this.#life.reason as SessionExpiredError;
    }
    return status;
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
    const untilDeadline = Math.max(0, this.#life.localDeadline - performance.now());
    this.#watchdog = setTimeout(() => this.#life.checkDeadline(), untilDeadline + 1);
    this.#watchdog.unref();
  }

  /** Pushes the session's deadline in the database one interval out. */
  async #heartbeat(): Promise<void> {
    if (this.#life.recordedState !== 'live') return;
    const sentAt = performance.now();
    this.parts.metrics?.heartbeats.inc(this.#labels);
    let renewed: boolean;
    try {
      renewed = await renewSessionDeadline(this.parts.heartbeatPool, this.id);
    } catch (error) {
      if (this.#life.recordedState !== 'live') return;
      const left = this.#life.localDeadline - performance.now();
      const failure = { sessionId: this.id, processor: this.processor, interval: this.interval, left, error };
      const retryIn = reportHeartbeatFailure(failure, this.parts.metrics);
      // Transient: keep trying until the deadline has really passed.
      if (this.state === 'live') this.#scheduleHeartbeat(retryIn);
      return;
    }
    if (this.#life.recordedState !== 'live') return;
    if (!renewed) {
      this.#life.expire('its deadline passed in the database');
      return;
    }
    this.#life.renewed(sentAt);
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
    const givingUp = this.#life.giveUp(why);
    const expireAndClose = () => {
      this.#life.expire(why);
      this.close().catch((error) =>
        log.session('closing abandoned session %s failed: %s', this.id, describeError(error)),
      );
    };
    const ending = [...this.#works].flatMap((work) => work.endUnderWay ?? []);
    if (ending.length === 0) expireAndClose();
    else void Promise.allSettled(ending).then(expireAndClose);
    return givingUp;
  }

  /** The session expired or closed: no more heartbeats, and its work ended with it (`lost` or `canceled`). */
  #ended(): void {
    clearTimeout(this.#nextHeartbeat);
    clearTimeout(this.#watchdog);
    const outcome = this.#life.recordedState === 'closed' ? 'canceled' : 'lost';
    for (const work of this.#works) work.endedWithSession(outcome);
    this.#works.clear();
  }
}
