import { type RawBuilder, sql } from 'kysely';
import { claimedAndRecorded } from './claim-parts.js';
import type { ClaimStatus } from './claim-status.js';

/**
 * The claim of a retriever's machine, as one statement run in the retriever's
 * transaction (SERIALIZABLE by default): lock the machine, bump its
 * `claim_version`, insert the work row (taking over a row whose session
 * expired), and record history, provided the session is alive. It waits for
 * the machine's lock: a machine claimed since the transaction's snapshot
 * fails it with a serialization error, and the transaction runs again.
 */
export function claimMachineStatement(sessionId: string, process: string, machineId: string): RawBuilder<ClaimStatus> {
  return sql<ClaimStatus>`
    WITH live AS (
      SELECT session_id FROM sessions WHERE session_id = ${sessionId}::uuid AND deadline > now()),
    chosen AS (
      SELECT m.machine_id FROM machines m
      WHERE m.machine_id = ${machineId}::uuid AND EXISTS (SELECT 1 FROM live)
      FOR NO KEY UPDATE OF m),
    found AS (SELECT count(*)::int AS n FROM chosen),
    bumped AS (
      UPDATE machines m SET claim_version = m.claim_version + 1
      FROM chosen c WHERE m.machine_id = c.machine_id
      RETURNING m.machine_id),
    prior AS (
      SELECT w.session_id, s.deadline FROM work w
      JOIN sessions s ON s.session_id = w.session_id
      JOIN chosen c ON c.machine_id = w.machine_id
      WHERE w.process = ${process}),
    ${claimedAndRecorded(
      sql`SELECT b.machine_id, l.session_id, ${process} FROM bumped b CROSS JOIN live l`,
      sql`CROSS JOIN prior p`,
    )}
    SELECT EXISTS (SELECT 1 FROM live) AS bmdb_live,
           (SELECT n FROM found) AS bmdb_found,
           (SELECT machine_id::text FROM chosen) AS bmdb_first_candidate,
           EXISTS (SELECT 1 FROM claimed) AS bmdb_claimed,
           (SELECT session_id::text FROM prior) AS bmdb_took_over_from,
           (SELECT b.last_interval_seconds FROM work_backoff b JOIN claimed c
            ON b.machine_id = c.machine_id AND b.process = c.process) AS bmdb_last_interval_seconds,
           c.machine_id
    FROM (SELECT 1) AS one LEFT JOIN chosen c ON true`;
}
