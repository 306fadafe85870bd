import { type Expression, type RawBuilder, sql } from 'kysely';
import type { SelectionRow } from '../selection.js';
import { chosenFrom, claimedAndRecorded } from './claim-parts.js';
import type { BatchClaimStatus } from './claim-status.js';

/**
 * {@link claimSelectedStatement} for a batch of one session (`sessions` holds
 * exactly one ID), without the second look at the selection: the quick
 * claim of a lone worker. It does what the batched statement does for one
 * request, and answers the same row (`bmdb_ord` 1), but without the
 * bookkeeping that shares machines out among requests (numbering, matching
 * slots, joining the answers back to the requests): a plan of fewer nodes,
 * each of which PostgreSQL sets up on every execution. An answer without a
 * machine and without candidates is not final, as for `lookFurther: false`.
 */
export function claimSelectedForOneStatement(
  process: string,
  selection: Expression<SelectionRow>,
  sessions: readonly string[],
): RawBuilder<BatchClaimStatus> {
  return sql<BatchClaimStatus>`
    WITH live AS MATERIALIZED (
      SELECT s.session_id FROM sessions s
      WHERE s.session_id = (${sessions}::uuid[])[1] AND s.deadline > now()),
    ${chosenFrom(selection)},
    bumped AS (
      UPDATE machines m SET claim_version = m.claim_version + 1
      WHERE m.machine_id = (SELECT machine_id FROM chosen)
      RETURNING m.machine_id),
    prior AS (
      SELECT w.machine_id, w.session_id, s.deadline FROM work w
      JOIN sessions s ON s.session_id = w.session_id
      WHERE w.machine_id = (SELECT machine_id FROM chosen) AND w.process = ${process}),
    ${claimedAndRecorded(
      sql`SELECT b.machine_id, l.session_id, ${process} FROM bumped b CROSS JOIN live l`,
      sql`CROSS JOIN prior p`,
    )}
    SELECT '1' AS bmdb_ord,
           l.session_id IS NOT NULL AS bmdb_live,
           (k.machine_id IS NOT NULL AND d.machine_id IS NULL)::int AS bmdb_found,
           CASE WHEN d.machine_id IS NULL THEN k.machine_id::text END AS bmdb_first_candidate,
           d.machine_id IS NOT NULL AS bmdb_claimed,
           p.session_id::text AS bmdb_took_over_from,
           b.last_interval_seconds AS bmdb_last_interval_seconds,
           c.*
    FROM (SELECT 1) AS one
    LEFT JOIN live l ON true
    LEFT JOIN chosen k ON true
    LEFT JOIN claimed d ON true
    LEFT JOIN chosen c ON c.machine_id = d.machine_id
    LEFT JOIN prior p ON p.machine_id = d.machine_id
    -- A join, not a subquery: as a subquery its generic plan could read every backoff of the process.
    LEFT JOIN work_backoff b ON b.machine_id = d.machine_id AND b.process = ${process}`;
}
