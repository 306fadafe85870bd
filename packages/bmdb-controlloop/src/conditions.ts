/**
 * Conditions other queries embed: live work, running backoff and an
 * operator's hold on a machine. Selections of your own use them to agree
 * with the shepherd's.
 */
import { type RawBuilder, sql } from 'kysely';

/**
 * Whether the machine at `machineId` (a column reference such as
 * `'mp.machine_id'`) has work of any of `processes` held by a live session.
 * Work of an expired session does not count: its holder is gone.
 *
 * Use it to keep a machine out of your selection while other processes work
 * on it (the shepherd's are the model's `SHEPHERD_PROCESSES`):
 * `.where(sql<boolean>\`NOT ${hasLiveWork('r.machine_id', ['OsInstall'])}\`)`.
 */
export function hasLiveWork(machineId: string, processes: readonly string[]): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (
    SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
    WHERE w.machine_id = ${sql.ref(machineId)}
      AND w.process IN (${sql.join(processes)})
      AND s.deadline > now())`;
}

/** Whether the machine at `machineId` has a running backoff for `process`. */
export function inBackoff(machineId: string, process: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (
    SELECT 1 FROM work_backoff b
    WHERE b.machine_id = ${sql.ref(machineId)} AND b.process = ${process} AND b.until > now())`;
}

/**
 * Whether an operator holds the machine at `machineId` (`shepherd hold`): a
 * primary-key probe of `machine_hold`. Every selection the library builds
 * leaves held machines out unless it opts in (`includeHeld`); a selection
 * of your own written without `selectionFor` should too:
 * `.where(sql<boolean>\`NOT ${isHeld('mp.machine_id')}\`)`.
 */
export function isHeld(machineId: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (SELECT 1 FROM machine_hold hd WHERE hd.machine_id = ${sql.ref(machineId)})`;
}
