import { type Expression, type RawBuilder, sql } from 'kysely';
import type { SelectionRow } from '../selection.js';

/*
 * The parts the claim statements share, written once. Each is a CTE (or two)
 * whose text is spliced verbatim into the statement: a statement's text is
 * its prepared statement's name, so these parts keep their layout.
 */

/**
 * `chosen`: the first rows of `selection`, at most one per live request,
 * locked unless a concurrent claim holds them, and only while their
 * `claim_version` is still the one the selection saw (see
 * claim-selected.ts for why that makes a claim exclusive).
 */
export function chosenFrom(selection: Expression<SelectionRow>): RawBuilder<unknown> {
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
export function claimedAndRecorded(rows: RawBuilder<unknown>, joinPrior: RawBuilder<unknown>): RawBuilder<unknown> {
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
