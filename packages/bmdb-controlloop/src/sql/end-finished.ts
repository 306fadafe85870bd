import { type RawBuilder, sql } from 'kysely';

/** SQLSTATE raised by `bmdb_work_lost()` (migration 0002) when an end finds no claim. */
export const WORK_LOST = 'BMW01';

/**
 * Deletes `sessionId`'s work row of (`machineId`, `process`), only while
 * the session is alive in the database, writes `Finished` and clears the
 * backoff, in one statement: the opening of `Work.finish(fn)`'s transaction. If the row is gone, the
 * database raises {@link WORK_LOST}.
 *
 * Values are inlined as literals, so the statement can share one round trip
 * with the `BEGIN` before it (a simple query may hold several statements;
 * one with parameters may not).
 */
export function endFinishedStatement(machineId: string, process: string, sessionId: string): RawBuilder<unknown> {
  const machine = sql.lit(machineId);
  const processLiteral = sql.lit(process);
  const session = sql.lit(sessionId);
  return sql`
      WITH released AS (
        DELETE FROM work w USING sessions s
        WHERE w.machine_id = ${machine}::uuid AND w.process = ${processLiteral}
          AND w.session_id = ${session}::uuid
          AND s.session_id = w.session_id AND s.deadline > now()
        RETURNING w.machine_id, w.process),
      history AS (
        INSERT INTO work_history (machine_id, process, event, "timestamp")
        SELECT machine_id, process, 'Finished', now() FROM released),
      backoff AS (
        DELETE FROM work_backoff b USING released r WHERE b.machine_id = r.machine_id AND b.process = r.process)
      SELECT bmdb_work_lost(${machine}::uuid, ${processLiteral}, ${session}::uuid)
      WHERE (SELECT count(*) FROM released) <> 1`;
}
