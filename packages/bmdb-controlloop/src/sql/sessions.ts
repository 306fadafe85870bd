import { type Kysely, type RawBuilder, sql } from 'kysely';
import type pg from 'pg';
import type { Database } from '../schema.js';
import { historyOfReleased, notifiedOfReleased } from './end-work.js';

/*
 * Every statement on a session's own row, in one place: starting it, its
 * heartbeat, whether it is alive, and ending it (closed by its owner, or
 * collected once expired) with the claims it held. The claim and end
 * statements check a session's deadline as part of their own work; the
 * fleet's reports read sessions through the model's query functions (`@bmaas/bmdb-model`).
 */

/** What a new session's row records. */
export interface NewSession {
  readonly componentName: string;
  readonly runtimeInfo: string;
  readonly processor: string;
  /** The heartbeat interval, in whole seconds: the deadline starts this far out. */
  readonly intervalSeconds: number;
}

/** Inserts a session's row with its deadline one interval out; returns its ID. */
export async function insertSession(db: Kysely<Database>, session: NewSession): Promise<string> {
  const row = await db
    .insertInto('sessions')
    .values({
      component_name: session.componentName,
      runtime_info: session.runtimeInfo,
      processor: session.processor,
      interval_seconds: session.intervalSeconds,
      deadline: sql<Date>`now() + make_interval(secs => ${session.intervalSeconds})`,
    })
    .returning('session_id')
    .executeTakeFirstOrThrow();
  return row.session_id;
}

/**
 * One session heartbeat's round trip: pushes session `sessionId`'s deadline
 * one interval out, on the heartbeat pool so that it never queues behind
 * work. Resolves false if the database already considers the session dead.
 */
export async function renewSessionDeadline(pool: pg.Pool, sessionId: string): Promise<boolean> {
  const client = await pool.connect();
  try {
    const result = await client.query(
      `UPDATE sessions SET deadline = now() + make_interval(secs => interval_seconds)
           WHERE session_id = $1 AND deadline > now()`,
      [sessionId],
    );
    client.release();
    return result.rowCount === 1;
  } catch (error) {
    // A failed or timed-out connection must not go back to the pool.
    client.release(error instanceof Error ? error : new Error(String(error)));
    throw error;
  }
}

/**
 * Whether session `sessionId` is alive in the database: its row is there
 * and its deadline has not passed. In a transaction, the check is part of
 * its snapshot (`Session.transact`).
 */
export async function sessionAlive(db: Kysely<Database>, sessionId: string): Promise<boolean> {
  const row = await db
    .selectFrom('sessions')
    .select('session_id')
    .where('session_id', '=', sessionId)
    .where(sql<boolean>`deadline > now()`)
    .executeTakeFirst();
  return row !== undefined;
}

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
