/**
 * Conditions other queries embed: live work and running backoff on a machine.
 * Selections of your own use them to agree with the shepherd's.
 */
import { type RawBuilder, sql } from 'kysely';

/**
 * Whether the machine at `machineId` (a column reference such as
 * `'mp.machine_id'`) has work of any of `processes` held by a live session.
 * Work of an expired session does not count: its holder is gone.
 *
 * Use it to keep your own selection queries consistent with the shepherd's:
 * `.where(sql<boolean>\`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}\`)`.
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
