import { type Expression, type RawBuilder, sql } from 'kysely';

/** A row of a selection query (`Selection`): it names a machine, and may carry more. */
export interface SelectionRow {
  readonly machine_id: string;
}

/*
 * The statements that claim work, and the parts they share, written once:
 * each part is a CTE (or two) whose text is spliced verbatim into the
 * statement, and a statement's text names its prepared statement, so the
 * parts keep their layout. A selection's claims (`claimSelectedStatement`
 * and, for a batch of one, `claimSelectedForOneStatement`; which one a
 * batch is sent with is the table in internal/selection-claims.ts) run as
 * one statement at READ COMMITTED; a retriever's (`claimMachineStatement`)
 * in the retriever's transaction.
 */

/** The bookkeeping columns of a claim statement's result row for one request. */
export interface ClaimStatus {
  /** The session was alive (its deadline not passed) when the claim ran. */
  readonly bmdb_live: boolean;
  /** Candidates the statement saw but did not claim for anyone (taken by concurrent claims, or left over). */
  readonly bmdb_found: number;
  /** A candidate left unclaimed, to name in a conflict. */
  readonly bmdb_first_candidate: string | null;
  /** Whether a machine was claimed for this request; its selection row's columns follow. */
  readonly bmdb_claimed: boolean;
  /** The expired session a stale claim was taken over from. */
  readonly bmdb_took_over_from: string | null;
  /** The interval of the pair's last failure, if a backoff is recorded. */
  readonly bmdb_last_interval_seconds: number | null;
  readonly machine_id: string | null;
}

/** A batched claim's row: a {@link ClaimStatus} for the request at `bmdb_ord` (1-based). */
export interface BatchClaimStatus extends ClaimStatus {
  readonly bmdb_ord: string;
}

/** The claim of a retriever's machine's row. */
export interface MachineClaimStatus {
  /** The session was alive (its deadline not passed) when the claim ran. */
  readonly bmdb_live: boolean;
  /** 1 if the machine exists (and the session was alive), else 0. */
  readonly bmdb_exists: number;
  /** Whether the machine was claimed. */
  readonly bmdb_claimed: boolean;
  /** The expired session a stale claim was taken over from. */
  readonly bmdb_took_over_from: string | null;
  /** The interval of the pair's last failure, if a backoff is recorded. */
  readonly bmdb_last_interval_seconds: number | null;
}

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
 * a stale view of its claims, by any process. A hold bumps the version too
 * (the model's `holdMachine`), so a hold committed after the snapshot is honoured as
 * one committed before it, which the selection sees. A request left without a
 * machine while candidates were skipped learns of them (`bmdb_found`), and
 * the caller tries again on a fresh snapshot.
 *
 * The statement is prepared once and runs on its generic plan: every table
 * besides the selection's is reached through keys the statement holds
 * (`= ANY (...)`), so no plan can scan one that grew since it was made.
 */
export function claimSelectedStatement(
  process: string,
  selection: Expression<SelectionRow>,
  sessions: readonly string[],
): RawBuilder<BatchClaimStatus> {
  // Only when some live request is left without a machine: is there more
  // the statement could not have (locked, or claimed since its snapshot)?
  const more = sql`more AS (
      SELECT x.machine_id FROM (${selection}) x
      WHERE (SELECT count(*) FROM chosen) < (SELECT count(*) FROM live)
        AND NOT EXISTS (SELECT 1 FROM chosen c WHERE c.machine_id = x.machine_id)
      LIMIT 1),`;
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

/**
 * {@link claimSelectedStatement} for a batch of one session (`sessions` holds
 * exactly one ID), without the second look at the selection: the quick
 * claim of a lone worker. It does what the batched statement does for one
 * request, and answers the same row (`bmdb_ord` 1), but without the
 * bookkeeping that shares machines out among requests (numbering, matching
 * slots, joining the answers back to the requests): a plan of fewer nodes,
 * each of which PostgreSQL sets up on every execution. Without the second
 * look, a request left without a machine learns only of the candidate it
 * chose but could not claim: an answer without a machine and without a
 * candidate is not final, and the full statement confirms it.
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

/**
 * The claim of a retriever's machine, as one statement run in the retriever's
 * transaction (SERIALIZABLE by default): lock the machine, bump its
 * `claim_version`, insert the work row (taking over a row whose session
 * expired), and record history, provided the session is alive. It waits for
 * the machine's lock: a machine claimed since the transaction's snapshot
 * fails it with a serialization error, and the transaction runs again.
 */
export function claimMachineStatement(
  sessionId: string,
  process: string,
  machineId: string,
): RawBuilder<MachineClaimStatus> {
  return sql<MachineClaimStatus>`
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
           (SELECT n FROM found) AS bmdb_exists,
           (SELECT machine_id::text FROM chosen) AS bmdb_first_candidate,
           EXISTS (SELECT 1 FROM claimed) AS bmdb_claimed,
           (SELECT session_id::text FROM prior) AS bmdb_took_over_from,
           (SELECT b.last_interval_seconds FROM work_backoff b JOIN claimed c
            ON b.machine_id = c.machine_id AND b.process = c.process) AS bmdb_last_interval_seconds,
           c.machine_id
    FROM (SELECT 1) AS one LEFT JOIN chosen c ON true`;
}

/**
 * `chosen`: the first rows of `selection`, at most one per live request,
 * locked unless a concurrent claim holds them, and only while their
 * `claim_version` is still the one the selection saw (see
 * {@link claimSelectedStatement} for why that makes a claim exclusive).
 */
function chosenFrom(selection: Expression<SelectionRow>): RawBuilder<unknown> {
  return sql`chosen AS MATERIALIZED (
      SELECT s.* FROM (
        SELECT s.*, m0.claim_version AS bmdb_seen_version
        FROM (${selection}) s JOIN machines m0 ON m0.machine_id = s.machine_id
        -- Keeps the version the selection saw apart from the row locked below.
        OFFSET 0) s
      JOIN machines m ON m.machine_id = s.machine_id AND m.claim_version = s.bmdb_seen_version
      LIMIT (SELECT count(*) FROM live)
      FOR NO KEY UPDATE OF m SKIP LOCKED)`;
}

/**
 * `claimed` and `history`: insert the work rows `rows` selects (machine,
 * session, process), taking over a row whose session expired, and record
 * `Started` for each, and `Canceled` for the expired session's claim taken
 * over (`prior`, joined to `claimed c` by `joinPrior`).
 */
function claimedAndRecorded(rows: RawBuilder<unknown>, joinPrior: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`claimed AS (
      INSERT INTO work (machine_id, session_id, process)
      ${rows}
      ON CONFLICT (machine_id, process) DO UPDATE SET session_id = excluded.session_id
      WHERE NOT EXISTS (
        SELECT 1 FROM sessions s WHERE s.session_id = work.session_id AND s.deadline > now())
      RETURNING machine_id, process),
    history AS (
      INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
      SELECT c.machine_id, c.process, 'Canceled', p.deadline,
             'session ' || p.session_id || ' expired holding this claim'
      FROM claimed c ${joinPrior}
      UNION ALL
      SELECT machine_id, process, 'Started', now(), NULL FROM claimed)`;
}
