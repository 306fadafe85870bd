import { type Expression, type RawBuilder, sql } from 'kysely';
import type { SelectionRow } from './selection.js';

/** What a claim statement picks its machine from. */
export type ClaimSource =
  /** One machine, named by a work retriever (the claim runs in the retriever's transaction). */
  | { readonly machineId: string }
  /** A selection query, embedded: the claim is one statement of its own. */
  | { readonly selection: Expression<SelectionRow> };

/** The bookkeeping columns of a claim statement's one result row. */
export interface ClaimStatus {
  /** The session was alive (its deadline not passed) when the claim ran. */
  readonly bmdb_live: boolean;
  /** Whether the selection had a candidate (1) or not (0). */
  readonly bmdb_found: number;
  /** The first candidate, to name in a conflict. */
  readonly bmdb_first_candidate: string | null;
  /** Whether a machine was claimed; its selection row's columns follow. */
  readonly bmdb_claimed: boolean;
  /** The expired session a stale claim was taken over from. */
  readonly bmdb_took_over_from: string | null;
  /** The interval of the pair's last failure, if a backoff is recorded. */
  readonly bmdb_last_interval_seconds: number | null;
  readonly machine_id: string | null;
}

/**
 * The claim, as one statement: choose a machine, lock it, bump its
 * `claim_version`, insert the work row (taking over a row whose session
 * expired), and record history, provided the session is alive.
 *
 * Exclusion rests on the machine row, which every claim locks and updates:
 *
 * - From a selection, the statement runs at READ COMMITTED. It walks the
 *   selection's rows in order and locks the first machine it can, skipping
 *   rows locked by claims in flight (`SKIP LOCKED`), and only if the row's
 *   `claim_version` is still the one the selection saw. A row updated since
 *   the statement's snapshot is re-checked against its newest version before
 *   it is locked (PostgreSQL's EvalPlanQual); a claim committed since then
 *   bumped the version, so the machine is skipped. Claims committed before
 *   the snapshot are visible to the selection, which excludes their
 *   machines. So no machine is claimed on a stale view of its claims, by any
 *   process. If every candidate was skipped, `found` still tells there were
 *   some: the caller tries again on a fresh snapshot.
 * - For a retriever's machine, the statement runs in the retriever's
 *   transaction (SERIALIZABLE by default) and waits for the lock: a machine
 *   claimed since the transaction's snapshot fails it with a serialization
 *   error, and the transaction runs again.
 */
export function claimStatement(sessionId: string, process: string, source: ClaimSource): RawBuilder<ClaimStatus> {
  const chosen =
    'machineId' in source
      ? sql`
      chosen AS (
        SELECT m.machine_id FROM machines m
        WHERE m.machine_id = ${source.machineId}::uuid AND EXISTS (SELECT 1 FROM live)
        FOR NO KEY UPDATE OF m),
      pool AS (SELECT machine_id FROM chosen),
      found AS (SELECT count(*)::int AS n FROM chosen)`
      : sql`
      chosen AS MATERIALIZED (
        SELECT s.* FROM (
          SELECT s.*, m0.claim_version AS bmdb_seen_version
          FROM (${source.selection}) s JOIN machines m0 ON m0.machine_id = s.machine_id
          -- Keeps the version the selection saw apart from the row locked below.
          OFFSET 0) s
        JOIN machines m ON m.machine_id = s.machine_id AND m.claim_version = s.bmdb_seen_version
        WHERE EXISTS (SELECT 1 FROM live)
        LIMIT 1
        FOR NO KEY UPDATE OF m SKIP LOCKED),
      pool AS (
        SELECT machine_id FROM chosen
        UNION ALL
        (SELECT x.machine_id FROM (${source.selection}) x WHERE NOT EXISTS (SELECT 1 FROM chosen) LIMIT 1)),
      found AS (SELECT count(*)::int AS n FROM pool)`;
  return sql<ClaimStatus>`
    WITH live AS (
      SELECT session_id FROM sessions WHERE session_id = ${sessionId}::uuid AND deadline > now()),
    ${chosen},
    bumped AS (
      UPDATE machines m SET claim_version = m.claim_version + 1
      FROM chosen c WHERE m.machine_id = c.machine_id
      RETURNING m.machine_id),
    prior AS (
      SELECT w.session_id, s.deadline FROM work w
      JOIN sessions s ON s.session_id = w.session_id
      JOIN chosen c ON c.machine_id = w.machine_id
      WHERE w.process = ${process}),
    claimed AS (
      INSERT INTO work (machine_id, session_id, process)
      SELECT b.machine_id, l.session_id, ${process} FROM bumped b CROSS JOIN live l
      ON CONFLICT (machine_id, process) DO UPDATE SET session_id = excluded.session_id
      WHERE NOT EXISTS (
        SELECT 1 FROM sessions s WHERE s.session_id = work.session_id AND s.deadline > now())
      RETURNING machine_id, process),
    history AS (
      INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
      SELECT c.machine_id, c.process, 'Canceled', p.deadline,
             'session ' || p.session_id || ' expired holding this claim'
      FROM claimed c CROSS JOIN prior p
      UNION ALL
      SELECT machine_id, process, 'Started', now(), NULL FROM claimed)
    SELECT EXISTS (SELECT 1 FROM live) AS bmdb_live,
           (SELECT n FROM found) AS bmdb_found,
           (SELECT machine_id::text FROM pool LIMIT 1) AS bmdb_first_candidate,
           EXISTS (SELECT 1 FROM claimed) AS bmdb_claimed,
           (SELECT session_id::text FROM prior) AS bmdb_took_over_from,
           (SELECT b.last_interval_seconds FROM work_backoff b JOIN claimed c
            ON b.machine_id = c.machine_id AND b.process = c.process) AS bmdb_last_interval_seconds,
           c.*
    FROM (SELECT 1) AS one LEFT JOIN chosen c ON true`;
}
