import { CHANGES_CHANNEL } from '../internal/changes.js';

/**
 * What every statement that ends claims in batches writes the same way,
 * once: the batch end (sql/end-work.ts) and the session close and collection
 * (sql/end-sessions.ts). Both read a CTE `released` of the work rows they
 * deleted, with `machine_id` and `process`. Plain text, not kysely's `sql`,
 * because the batch statement is text: its text is its prepared statement's
 * name.
 */

/**
 * The CTE `history`: one event per row of `released`, each argument an SQL
 * expression over `released`'s columns (`event`, `now()`, `cause`).
 */
export function historyOfReleased(event: string, at: string, cause: string): string {
  return `history AS (
    INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
    SELECT machine_id, process, ${event}, ${at}, ${cause} FROM released)`;
}

/**
 * The CTE `notified`: machines whose claim was canceled are eligible again at
 * once (a finish or failure leaves them tagged or backed off). `where`
 * narrows `released` to the canceled rows (empty when all are). It runs only
 * when the statement's final SELECT reads it, and notifies only if such a
 * row exists.
 */
export function notifiedOfReleased(where: string): string {
  return `notified AS (
    SELECT pg_notify('${CHANGES_CHANNEL}', 'work')
    FROM (SELECT 1 FROM released${where} LIMIT 1) c)`;
}
