import { type RawBuilder, sql } from 'kysely';
import { historyOfReleased, notifiedOfReleased } from './end-parts.js';

/** How many sessions a statement of this file ended, and the claims it ended with them. */
export interface SessionsEnded {
  readonly sessions: number;
  readonly work: number;
}

/**
 * Deletes the sessions `which` selects and cancels every claim they held:
 * its work row deleted, a `Canceled` event in its history at `at`, naming
 * the session and why it ended; an end announces the machines free
 * again. The one statement for the work a session leaves behind, whether
 * its owner closed it or it expired; a single work item's end is
 * sql/end-work.ts.
 */
function endSessions(
  which: RawBuilder<boolean>,
  at: 'now()' | 'deadline',
  why: 'closed' | 'expired',
): RawBuilder<SessionsEnded> {
  return sql<SessionsEnded>`
    WITH ended AS (
      DELETE FROM sessions WHERE ${which} RETURNING session_id, deadline),
    released AS (
      DELETE FROM work w USING ended e WHERE w.session_id = e.session_id
      RETURNING w.machine_id, w.process, e.session_id, e.deadline),
    ${sql.raw(historyOfReleased(`'Canceled'`, at, `'session ' || session_id || ' ${why}'`))},
    ${sql.raw(notifiedOfReleased(''))}
    SELECT (SELECT count(*)::int FROM ended) AS sessions, (SELECT count(*)::int FROM released) AS work,
           (SELECT count(*) FROM notified) AS notified`;
}

/** Closes session `sessionId`: its claims end as of now, `session <id> closed`. */
export function closeSessionStatement(sessionId: string): RawBuilder<SessionsEnded> {
  return endSessions(sql<boolean>`session_id = ${sessionId}::uuid`, 'now()', 'closed');
}

/**
 * Collects the sessions whose deadline passed: their claims end as
 * of that deadline, `session <id> expired`.
 */
export function collectExpiredSessionsStatement(): RawBuilder<SessionsEnded> {
  return endSessions(sql<boolean>`deadline < now()`, 'deadline', 'expired');
}
