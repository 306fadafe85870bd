import { type Kysely, sql } from 'kysely';
import { type Backoff, nextBackoffSeconds } from './backoff.js';
import { WorkEndedError, type WorkEndState, WorkLostError, type WorkOutcome } from './errors.js';
import { notifyReleased } from './internal/changes.js';
import { log } from './internal/log.js';
import type { SessionRuntime } from './internal/runtime.js';
import { Queries } from './queries.js';
import type { Database } from './schema.js';

/** What a work retriever may return: machine IDs, or rows that carry one. */
export type WorkCandidate = string | { readonly machineId: string };

type WorkState = 'active' | WorkEndState;

/**
 * An exclusive claim on one (machine, process), held by a session. End it
 * exactly once with {@link Work.finish} or {@link Work.fail}; {@link
 * Work.cancel} releases it without a verdict and is a no-op once ended, so it
 * belongs in a `finally`.
 */
export class Work<T extends WorkCandidate = WorkCandidate> {
  #state: WorkState = 'active';
  #ending: Promise<unknown> | undefined;

  /** @internal Created by `Session.work`. */
  constructor(
    private readonly runtime: SessionRuntime,
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
   * Ends the work successfully in one transaction: releases the claim, clears
   * the pair's backoff, records `Finished`, and runs `fn` (which sets the
   * machine's tags). If `fn` throws, nothing is recorded and the work stays
   * active.
   *
   * @throws {@link WorkEndedError} if the work already ended
   * @throws {@link WorkLostError} if the session no longer holds the claim
   */
  async finish(fn?: (q: Queries) => Promise<void>): Promise<void> {
    await this.#end('finished', async () => {
      await this.runtime.transaction(async (trx) => {
        await this.#release(trx, 'Finished');
        if (fn) await fn(new Queries(trx));
      });
    });
  }

  /**
   * Ends the work as failed: releases the claim, records `Failed` with
   * `cause`, and backs the pair off for the next interval of `backoff` (or
   * the previous interval again when `backoff` is undefined).
   *
   * @throws {@link WorkEndedError} if the work already ended
   * @throws {@link WorkLostError} if the session no longer holds the claim
   */
  async fail(backoff: Backoff | undefined, cause: string): Promise<void> {
    const interval = nextBackoffSeconds(backoff, this.previousBackoffSeconds);
    await this.#end('failed', () =>
      this.runtime.statement((db) => this.#release(db, 'Failed', { cause, backoffSeconds: interval })),
    );
    log.work('machine %s %s failed, backing off %ds: %s', this.machineId, this.process, interval, cause);
  }

  /**
   * Releases the claim without a verdict, recording `Canceled`. A no-op when
   * the work already ended; waits for an end in progress first.
   */
  async cancel(): Promise<void> {
    if (this.#state === 'ending') await this.#ending?.catch(() => undefined);
    if (this.#state !== 'active') return;
    await this.#end('canceled', () =>
      this.runtime.statement(async (db) => {
        await sql`
          WITH released AS (
            DELETE FROM work
            WHERE machine_id = ${this.machineId}::uuid AND process = ${this.process}
              AND session_id = ${this.runtime.sessionId}::uuid
            RETURNING machine_id, process),
          history AS (
            INSERT INTO work_history (machine_id, process, event, "timestamp")
            SELECT machine_id, process, 'Canceled', now() FROM released),
          ${notifyReleased}
          SELECT count(*) AS notified FROM notified`.execute(db);
      }),
    );
  }

  /** @internal The session closed or expired: the claim is gone with it. */
  abandon(outcome: 'canceled' | 'lost'): void {
    if (this.#state === 'active') this.#state = outcome;
  }

  async #end(outcome: WorkOutcome, run: () => Promise<void>): Promise<void> {
    if (this.#state !== 'active') throw new WorkEndedError(this.machineId, this.process, this.#state);
    if (outcome !== 'canceled') this.runtime.assertLive();
    this.#state = 'ending';
    const ending = run();
    this.#ending = ending;
    try {
      await ending;
      this.#state = outcome;
      this.runtime.workEnded(this, outcome);
    } catch (error) {
      this.#state = error instanceof WorkLostError ? 'lost' : 'active';
      if (this.#state === 'lost') this.runtime.workEnded(this, 'canceled');
      throw error;
    }
  }

  /**
   * Deletes this session's work row (only while the session is alive in the
   * database), writes the history event and updates the backoff, in one
   * statement.
   */
  async #release(
    db: Kysely<Database>,
    event: 'Finished' | 'Failed',
    failure?: { cause: string; backoffSeconds: number },
  ): Promise<void> {
    const { machineId, process } = this;
    const backoff =
      event === 'Finished'
        ? sql`DELETE FROM work_backoff b USING released r WHERE b.machine_id = r.machine_id AND b.process = r.process`
        : sql`INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
              SELECT machine_id, process, now() + make_interval(secs => ${failure?.backoffSeconds}),
                     ${failure?.cause}, ${failure?.backoffSeconds}::int
              FROM released
              ON CONFLICT (machine_id, process) DO UPDATE
              SET until = excluded.until, cause = excluded.cause,
                  last_interval_seconds = excluded.last_interval_seconds`;
    const { rows } = await sql<{ released: number }>`
      WITH released AS (
        DELETE FROM work w USING sessions s
        WHERE w.machine_id = ${machineId}::uuid AND w.process = ${process}
          AND w.session_id = ${this.runtime.sessionId}::uuid
          AND s.session_id = w.session_id AND s.deadline > now()
        RETURNING w.machine_id, w.process),
      history AS (
        INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
        SELECT machine_id, process, ${event}, now(), ${failure?.cause ?? null}::text FROM released),
      backoff AS (${backoff})
      SELECT count(*)::int AS released FROM released`.execute(db);
    if (rows[0]?.released !== 1) throw new WorkLostError(machineId, process, this.runtime.sessionId);
  }
}
