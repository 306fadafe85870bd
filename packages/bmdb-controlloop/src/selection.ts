import { type Expression, type RawBuilder, sql } from 'kysely';
import { hasLiveWork, inBackoff, isHeld } from './conditions.js';
import type { SelectionRow } from './sql/claim.js';
import type { WorkCandidate } from './work-candidate.js';

export type { SelectionRow } from './sql/claim.js';

/**
 * A selection query the library can embed in a claim: the machines that need
 * work, as a query rather than as rows, so that choosing one, locking it and
 * claiming it is one statement and one round trip.
 *
 * A selection belongs to one process: `query` excludes machines under live
 * work or running backoff of `process`, and machines an operator holds, and
 * claiming it for another process throws {@link ProcessMismatchError}. Build
 * one with {@link selectionFor}, which adds those exclusions itself; by hand,
 * `query` must select a `machine_id` column, have no `LIMIT` (the claim adds
 * its own) and exclude them itself (see {@link readyFor}).
 *
 * @example
 * ```ts
 * const selection: Selection<{ machineId: string }> = selectionFor('OsInstall', {
 *   query: q.selectFrom('machines').select('machine_id'),
 *   toCandidate: (row) => ({ machineId: row.machine_id }),
 * });
 * const work = await session.work('OsInstall', selection);
 * ```
 */
export interface Selection<T extends WorkCandidate, R extends SelectionRow = SelectionRow> {
  /** The process whose live work and backoff `query` excludes; the only one it claims for. */
  readonly process: string;
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

/** Which machines a selection may offer beyond those free of claims and backoffs. */
export interface ReadinessOptions {
  /**
   * Offer machines an operator holds (`shepherd hold`) too. Off by default:
   * a held machine is one a person is working on, and a loop must not take
   * it from under their hands. Work an operator asks for on a held machine
   * (a power action) opts in.
   */
  readonly includeHeld?: boolean;
}

/**
 * Whether the machine at `machineId` (a column reference such as
 * `'mp.machine_id'`) is free for work of `process`: no live work of it (nor
 * of any process in `exclusiveWith`), no running backoff of it, and no
 * operator's hold on it unless `options.includeHeld`.
 */
export function readyFor(
  machineId: string,
  process: string,
  exclusiveWith: readonly string[] = [],
  options: ReadinessOptions = {},
): RawBuilder<boolean> {
  const processes = [...new Set([process, ...exclusiveWith])];
  const free = sql<boolean>`NOT ${hasLiveWork(machineId, processes)} AND NOT ${inBackoff(machineId, process)}`;
  return options.includeHeld ? sql<boolean>`(${free})` : sql<boolean>`(${free} AND NOT ${isHeld(machineId)})`;
}

/** What {@link selectionFor} builds a selection from. */
export interface SelectionSource<T extends WorkCandidate, R extends SelectionRow> extends ReadinessOptions {
  /**
   * The machines that need the work, whatever their claims and backoffs: a
   * query selecting a `machine_id` column (and what `toCandidate` needs),
   * without `LIMIT`, in the order they should be claimed.
   */
  readonly query: Expression<R>;
  /** The candidate handed to the work (`Work.candidate`) for a claimed row. */
  toCandidate(row: R): T;
  /**
   * Other processes whose live work also keeps a machine out, for work that
   * must not run alongside them (the shepherd's: the model's `SHEPHERD_PROCESSES`).
   */
  readonly exclusiveWith?: readonly string[];
}

/**
 * A {@link Selection} for `process`: the source's machines that have no live
 * work of `process` (or of `exclusiveWith`), no running backoff of
 * `process`, and no operator's hold (unless `source.includeHeld`). The
 * process is part of the selection, so it cannot be claimed for another one
 * by mistake.
 *
 * @example
 * ```ts
 * const selection = selectionFor('OsInstall', {
 *   query: db.selectFrom('os_install_request').select(['machine_id', 'image']),
 *   toCandidate: (row) => ({ machineId: row.machine_id, image: row.image }),
 * });
 * ```
 */
export function selectionFor<T extends WorkCandidate, R extends SelectionRow>(
  process: string,
  source: SelectionSource<T, R>,
): Selection<T, R> {
  // Aliased apart from the aliases the readiness subqueries use (w, s, b, hd).
  const query = sql<R>`SELECT bmdb_selected.* FROM (${source.query}) AS bmdb_selected
    WHERE ${readyFor('bmdb_selected.machine_id', process, source.exclusiveWith, {
      includeHeld: source.includeHeld ?? false,
    })}`;
  return { process, query, toCandidate: (row) => source.toCandidate(row) };
}
