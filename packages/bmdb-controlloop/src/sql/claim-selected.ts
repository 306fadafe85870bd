import { type Expression, type RawBuilder, sql } from 'kysely';
import type { SelectionRow } from '../selection.js';
import { chosenFrom, claimedAndRecorded } from './claim-parts.js';
import type { BatchClaimStatus } from './claim-status.js';

/**
 * Claims from a selection for several sessions at once, as one statement:
 * choose up to one machine per live session, lock them, bump their
 * `claim_version`, insert their work rows (taking over rows whose sessions
 * expired), and record history. `sessions` is the requests' session IDs (a
 * session may appear more than once, asking for as many machines); each gets
 * its own result row, by position (`bmdb_ord`).
 *
 * The statement runs at READ COMMITTED, and exclusion rests on the machine
 * row, which every claim locks and updates. It walks the selection's rows in
 * order and locks the first machines it can, skipping rows locked by claims
 * in flight (`SKIP LOCKED`), and only if a row's `claim_version` is still the
 * one the selection saw. A row updated since the statement's snapshot is
 * re-checked against its newest version before it is locked (PostgreSQL's
 * EvalPlanQual); a claim committed since then bumped the version, so the
 * machine is skipped. Claims committed before the snapshot are visible to
 * the selection, which excludes their machines. So no machine is claimed on
 * a stale view of its claims, by any process. A request left without a
 * machine while candidates were skipped learns of them (`bmdb_found`), and
 * the caller tries again on a fresh snapshot.
 *
 * The statement is prepared once and runs on its generic plan: every table
 * besides the selection's is reached through keys the statement holds
 * (`= ANY (...)`), so no plan can scan one that grew since it was made.
 *
 * With `lookFurther: false` the statement leaves out that second look at the
 * selection, and a request left without a machine learns only of candidates
 * it chose but could not claim: its `bmdb_found` may be 0 while there is
 * more. Such an answer must be confirmed by the full statement; in exchange
 * the statement is a third smaller, and PostgreSQL sets up every node of a
 * plan on every execution, run or not.
 */
export function claimSelectedStatement(
  process: string,
  selection: Expression<SelectionRow>,
  sessions: readonly string[],
  { lookFurther = true }: { readonly lookFurther?: boolean } = {},
): RawBuilder<BatchClaimStatus> {
  // Only when some live request is left without a machine: is there more
  // the statement could not have (locked, or claimed since its snapshot)?
  const more = lookFurther
    ? sql`more AS (
      SELECT x.machine_id FROM (${selection}) x
      WHERE (SELECT count(*) FROM chosen) < (SELECT count(*) FROM live)
        AND NOT EXISTS (SELECT 1 FROM chosen c WHERE c.machine_id = x.machine_id)
      LIMIT 1),`
    : sql`more AS (SELECT NULL::uuid AS machine_id WHERE false),`;
  return sql<BatchClaimStatus>`
    WITH requests AS (
      SELECT r.session_id, r.ord FROM unnest(${sessions}::uuid[]) WITH ORDINALITY AS r (session_id, ord)),
    live AS MATERIALIZED (
      SELECT r.ord, r.session_id, row_number() OVER (ORDER BY r.ord) AS slot
      FROM requests r JOIN sessions s ON s.session_id = r.session_id
      WHERE s.session_id = ANY (${sessions}::uuid[]) AND s.deadline > now()),
    ${chosenFrom(selection)},
    assigned AS (
      SELECT c.machine_id, l.session_id, l.ord
      FROM (SELECT machine_id, row_number() OVER () AS slot FROM chosen) c
      JOIN live l ON l.slot = c.slot),
    bumped AS (
      UPDATE machines m SET claim_version = m.claim_version + 1
      WHERE m.machine_id = ANY (ARRAY(SELECT machine_id FROM chosen))
      RETURNING m.machine_id),
    prior AS (
      SELECT w.machine_id, w.session_id, s.deadline FROM work w
      JOIN sessions s ON s.session_id = w.session_id
      WHERE w.machine_id = ANY (ARRAY(SELECT machine_id FROM chosen)) AND w.process = ${process}),
    ${claimedAndRecorded(
      sql`SELECT a.machine_id, a.session_id, ${process} FROM assigned a JOIN bumped b ON b.machine_id = a.machine_id`,
      sql`JOIN prior p ON p.machine_id = c.machine_id`,
    )},
    ${more}
    unclaimed AS (
      SELECT machine_id FROM more
      UNION ALL
      SELECT c.machine_id FROM chosen c WHERE NOT EXISTS (SELECT 1 FROM claimed d WHERE d.machine_id = c.machine_id))
    SELECT r.ord::text AS bmdb_ord,
           l.ord IS NOT NULL AS bmdb_live,
           (SELECT count(*)::int FROM unclaimed) AS bmdb_found,
           (SELECT machine_id::text FROM unclaimed LIMIT 1) AS bmdb_first_candidate,
           d.machine_id IS NOT NULL AS bmdb_claimed,
           p.session_id::text AS bmdb_took_over_from,
           b.last_interval_seconds AS bmdb_last_interval_seconds,
           c.*
    FROM requests r
    LEFT JOIN live l ON l.ord = r.ord
    LEFT JOIN assigned a ON a.ord = r.ord
    LEFT JOIN claimed d ON d.machine_id = a.machine_id
    LEFT JOIN chosen c ON c.machine_id = d.machine_id
    LEFT JOIN prior p ON p.machine_id = d.machine_id
    -- A join, not a subquery: as a subquery its generic plan could read every backoff of the process.
    LEFT JOIN work_backoff b ON b.machine_id = d.machine_id AND b.process = ${process}`;
}
