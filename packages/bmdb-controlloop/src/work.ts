import { describeError, sleep } from '@bmaas/common';
import { CompiledQuery, type Kysely, type RawBuilder } from 'kysely';
import { type Backoff, nextBackoffSeconds } from './backoff.js';
import { BMDBError, WorkEndedError, type WorkEndState, WorkLostError, type WorkOutcome } from './errors.js';
import { connectionLoss, describeConnectionLoss, isConnectionLost } from './internal/connection-lost.js';
import { log } from './internal/log.js';
import { withRetry } from './internal/retry.js';
import { retryMetrics } from './internal/retry-metrics.js';
import type { Database } from './schema.js';
import type { SessionLife } from './session-life.js';
import type { SessionParts } from './session-parts.js';
import { type EndRequest, endFinishedStatement, WORK_LOST } from './sql/end-work.js';
import { sessionAlive } from './sql/sessions.js';
import { type FinishTags, tagWrites } from './tags.js';
import type { WorkCandidate } from './work-candidate.js';

/**
 * How an end is made: in the next batch of ends (`finish(tags)`, `fail`,
 * `cancel`), or by a transaction running the caller's function (`finish(fn)`).
 */
type End = Pick<EndRequest, 'event' | 'failure' | 'tags'> | ((q: Kysely<Database>) => Promise<void>);

/** Where a work item stands: `active` until it ends, then how it ended. */
export type WorkState = 'active' | WorkEndState;

const noResult = (): void => undefined;

/**
 * An exclusive claim on one (machine, process), held by a session. End it
 * exactly once with {@link Work.finish} or {@link Work.fail}; {@link
 * Work.cancel} ends it without a verdict and is a no-op once ended, so it
 * belongs in a `finally`.
 */
export class Work<T extends WorkCandidate = WorkCandidate> {
  #state: WorkState = 'active';
  #ending: Promise<unknown> | undefined;
  #endSent: () => void = noResult;
  readonly #endStarted = new Promise<void>((resolve) => {
    this.#endSent = resolve;
  });

  /** @internal A claim `Session.work` made. */
  static claimed<T extends WorkCandidate>(
    session: SessionLife,
    parts: SessionParts,
    works: Set<Work<T>>,
    machineId: string,
    process: string,
    candidate: T,
    previousBackoffSeconds: number | undefined,
  ): Work<T> {
    return new Work(session, parts, works, machineId, process, candidate, previousBackoffSeconds);
  }

  // Private: only a claim makes work (`Session.work`, through `claimed`).
  private constructor(
    /** Where the session holding the claim stands. */
    private readonly session: SessionLife,
    private readonly parts: SessionParts,
    /** The session's work, which this leaves once ended. */
    private readonly works: Set<Work<T>>,
    /** The machine claimed. */
    readonly machineId: string,
    /** The process the claim is for. */
    readonly process: string,
    /** The candidate the retriever returned for this machine. */
    readonly candidate: T,
    /** The interval of this pair's last failure, if a backoff is recorded. */
    readonly previousBackoffSeconds: number | undefined,
  ) {}

  /** `active` until ended; then how it ended (`lost` if the session lost it). */
  get state(): WorkState {
    return this.#state;
  }

  /**
   * Ends the work successfully: gives the claim back, clears the pair's
   * backoff, records `Finished` and writes the machine's tags, all or
   * nothing. Two forms:
   *
   * - `finish(tags?)` writes tags the library knows ({@link FinishTags}) in
   *   the ending statement itself. The finishes, failures and cancels of
   *   concurrent work go to the database together, as one statement: this is
   *   the fast form.
   * - `finish(fn)` runs `fn` in the ending transaction (at the
   *   connection's isolation level), for writes of your own: three round
   *   trips for one statement of `fn`. If `fn` throws, nothing is recorded
   *   and the work stays active.
   *
   * @example
   * ```ts
   * await work.finish({ set: { agentStarted: { publicKey } } });
   * await work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
   * await work.finish((q) => q.updateProviderStatus(provider, providerId, { providerStatus: 'Running' }));
   * ```
   *
   * @throws {@link WorkEndedError} if the work already ended
   * @throws {@link WorkLostError} if the session no longer holds the claim
   * @throws {@link BMDBError} for tags that make no sense (one both set and deleted)
   */
  async finish(how?: FinishTags | ((q: Kysely<Database>) => Promise<void>)): Promise<void> {
    if (typeof how === 'function') {
      await this.#end('finished', how);
      return;
    }
    const tags = how === undefined ? undefined : tagWrites(how);
    await this.#end('finished', { event: 'Finished', ...(tags && { tags }) });
  }

  /**
   * Ends the work as failed: gives the claim back, records `Failed` with
   * `cause`, and backs the pair off for the next interval of `backoff` (or
   * the previous interval again when `backoff` is undefined). Sent with the
   * ends of concurrent work, as one statement.
   *
   * @throws {@link WorkEndedError} if the work already ended
   * @throws {@link WorkLostError} if the session no longer holds the claim
   */
  async fail(backoff: Backoff | undefined, cause: string): Promise<void> {
    const interval = nextBackoffSeconds(backoff, this.previousBackoffSeconds);
    await this.#end('failed', { event: 'Failed', failure: { cause, backoffSeconds: interval } });
    log.work('machine %s %s failed, backing off %ds: %s', this.machineId, this.process, interval, cause);
  }

  /**
   * Ends the claim without a verdict, recording `Canceled`. A no-op when
   * the work already ended; waits for an end in progress first.
   */
  async cancel(): Promise<void> {
    if (this.#state === 'ending') await this.#ending?.catch(() => undefined);
    if (this.#state !== 'active') return;
    await this.#end('canceled', { event: 'Canceled' });
  }

  /**
   * @internal Resolves when an end of this work is first sent (finish, fail
   * or cancel), before the end itself goes: the control loop then claims its
   * worker's next machine while this end is on its way. Never settles for
   * work that ended with its session.
   */
  get ending(): Promise<void> {
    return this.#endStarted;
  }

  /** @internal The end on its way, while there is one: settles when it does. */
  get endUnderWay(): Promise<unknown> | undefined {
    return this.#state === 'ending' ? this.#ending : undefined;
  }

  /** @internal The session closed (`canceled`) or expired (`lost`): the claim ended with it. */
  endedWithSession(outcome: 'canceled' | 'lost'): void {
    if (this.#state === 'active') this.#state = outcome;
  }

  async #end(outcome: WorkOutcome, end: End): Promise<void> {
    if (this.#state !== 'active') throw new WorkEndedError(this.machineId, this.process, this.#state);
    if (outcome !== 'canceled') this.session.assertLive();
    this.#state = 'ending';
    this.#endSent();
    const ending = this.#persist(outcome, end);
    this.#ending = ending;
    try {
      await ending;
      this.#state = outcome;
      this.#ended(outcome);
    } catch (error) {
      this.#state = error instanceof WorkLostError ? 'lost' : 'active';
      if (this.#state === 'lost') this.#ended('canceled');
      throw error;
    }
  }

  /** Once ended: counted (`bmdb_work_finished_total`), and its session holds it no more. */
  #ended(outcome: WorkOutcome): void {
    this.works.delete(this);
    this.parts.metrics?.workEnded({ processor: this.session.processor, process: this.process }, outcome);
  }

  /**
   * Makes `end` again and again while the database cannot be reached and
   * the session lives: a restart of PostgreSQL must not leave the claim held,
   * nor make the work be done twice. After an attempt whose outcome the lost
   * connection hid, a claim found gone while the session is alive in the
   * database means that attempt committed — only the session itself removes
   * its claims while it lives. Once the session expires, the database
   * ends the claim anyway; the last error is thrown.
   */
  async #persist(outcome: WorkOutcome, end: End): Promise<void> {
    // The next claim goes out first (it takes longer than an end): what
    // awaits `ending` runs in this turn, before the first attempt.
    await undefined;
    let uncertain = false;
    let pause = RECONNECT_FIRST_PAUSE;
    for (;;) {
      try {
        return await this.#endOnce(end);
      } catch (error) {
        if (uncertain && error instanceof WorkLostError) {
          const alive = await this.#sessionAliveInDatabase();
          if (alive === true) {
            log.work('machine %s %s: %s before the connection was lost', this.machineId, this.process, outcome);
            return;
          }
          if (alive === false) throw error;
        } else if (!isConnectionLost(error)) {
          throw error;
        }
        if (this.session.signal.aborted) throw error;
        uncertain = true;
        const loss = connectionLoss(error);
        log.work(
          'machine %s %s: the BMDB is unreachable (%s%s); trying again in %d ms',
          this.machineId,
          this.process,
          loss ? `${describeConnectionLoss(loss)}: ` : '',
          describeError(error),
          pause,
        );
        try {
          await sleep(pause, this.session.signal);
        } catch {
          throw error;
        }
        pause = Math.min(pause * 2, RECONNECT_MAX_PAUSE);
      }
    }
  }

  /** Makes `end` once: in the next batch of ends, or in the caller's transaction. */
  async #endOnce(end: End): Promise<void> {
    if (typeof end === 'function') return this.#finishIn(end);
    // A claim already gone needs no cancelling.
    if (end.event === 'Canceled') return this.#endInBatch(end).catch(ignoreLost);
    return this.#endInBatch(end);
  }

  /** Finishes the work in a transaction of its own that runs `fn`; WorkLostError if the claim was gone. */
  async #finishIn(fn: (q: Kysely<Database>) => Promise<void>): Promise<void> {
    const opening = endFinishedStatement(this.machineId, this.process, this.session.id);
    const { db, metrics } = this.parts;
    await withRetry(
      () => db.connection().execute((one) => openedBy(one, opening, (trx) => fn(trx))),
      retryMetrics(metrics, [this.session.processor]),
    ).then(noResult, (error: unknown) => this.#lost(error));
  }

  /** Ends the work in the next batch of ends; WorkLostError if the claim was gone. */
  async #endInBatch(end: Pick<EndRequest, 'event' | 'failure' | 'tags'>): Promise<void> {
    const { id: sessionId, processor } = this.session;
    if (
      !(await this.parts.ends.end({ machineId: this.machineId, process: this.process, sessionId, processor, ...end }))
    ) {
      throw new WorkLostError(this.machineId, this.process, sessionId);
    }
  }

  /**
   * Whether the session's row is alive in the database right now; `undefined`
   * when the database cannot be reached to tell.
   */
  async #sessionAliveInDatabase(): Promise<boolean | undefined> {
    try {
      return await sessionAlive(this.parts.db, this.session.id);
    } catch (error) {
      if (isConnectionLost(error)) return undefined;
      throw error;
    }
  }

  /** WorkLostError for the database's {@link WORK_LOST}; other errors as they are. */
  #lost(error: unknown): never {
    if ((error as { code?: unknown } | null)?.code === WORK_LOST) {
      throw new WorkLostError(this.machineId, this.process, this.session.id);
    }
    throw error;
  }
}

/** A cancel of a claim already gone has nothing left to do. */
function ignoreLost(error: unknown): void {
  if (!(error instanceof WorkLostError)) throw error;
}

/**
 * Runs `fn` in a transaction on `db` (one connection) whose `BEGIN` and first
 * statement go in one simple query: a round trip less than Kysely's
 * `transaction()`. The transaction's level is the connection's default.
 */
async function openedBy<T>(
  db: Kysely<Database>,
  opening: RawBuilder<unknown>,
  fn: (trx: Kysely<Database>) => Promise<T>,
): Promise<T> {
  const first = opening.compile(db);
  if (first.parameters.length > 0) throw new BMDBError('a transaction-opening statement must inline its values');
  try {
    await db.executeQuery(CompiledQuery.raw(`BEGIN; ${first.sql}`));
    const result = await fn(db);
    await db.executeQuery(CompiledQuery.raw('COMMIT'));
    return result;
  } catch (error) {
    // After a failed COMMIT there is no transaction left: PostgreSQL only warns.
    await db.executeQuery(CompiledQuery.raw('ROLLBACK')).catch(() => undefined);
    throw error;
  }
}

/** Pauses between attempts to end work while the database is unreachable. */
const RECONNECT_FIRST_PAUSE = 100;
const RECONNECT_MAX_PAUSE = 1_000;
