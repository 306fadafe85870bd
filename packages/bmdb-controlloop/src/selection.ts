import type { Expression } from 'kysely';
import type { WorkCandidate } from './work.js';

/** A row of a selection query: it names a machine, and may carry more. */
export interface SelectionRow {
  readonly machine_id: string;
}

/**
 * A selection query the library can embed in a claim: the machines that need
 * work, as a query rather than as rows, so that choosing one, locking it and
 * claiming it is one statement and one round trip.
 *
 * `query` must select a `machine_id` column and have no `LIMIT` (the claim
 * adds its own). It must exclude machines under live work or running backoff
 * (see `hasLiveWork` and `inBackoff`), just like a work retriever.
 *
 * @example
 * ```ts
 * const selection: Selection<ProvidedMachine> = q.agentStartSelection({ provider: 'Example' });
 * const work = await session.work(Process.ShepherdAgentStart, selection);
 * ```
 */
export interface Selection<T extends WorkCandidate, R extends SelectionRow = SelectionRow> {
  /** The candidates, one row per machine, e.g. a Kysely `SelectQueryBuilder`. */
  readonly query: Expression<R>;
  /**
   * The candidate handed to the work (`Work.candidate`) for a claimed row.
   * Where a `Selection<T>` is expected (as from `ControlLoop.selectMachines`),
   * declare the parameter as the query's row type.
   */
  toCandidate(row: R): T;
}

/** Whether a `Session.work` argument is a {@link Selection} rather than a retriever function. */
export function isSelection<T extends WorkCandidate>(value: unknown): value is Selection<T> {
  return typeof value === 'object' && value !== null && 'query' in value && 'toCandidate' in value;
}
