/** The operator history: what people did to machines, with reason, actor and outcome. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import type { Kysely, Selectable } from 'kysely';
import type { Database, OperatorHistoryTable, OperatorOutcome } from '../schema.js';

/** One entry of a machine's operator history. */
export interface OperatorHistoryEntry {
  readonly machineId: string;
  /** `Hold`, `Unhold`, `PowerOn`, `PowerOff`, `PowerCycle`, or a component's own action. */
  readonly action: string;
  readonly outcome: OperatorOutcome;
  readonly reason: string | null;
  /** Who did it (`user@host`). */
  readonly actor: string;
  readonly timestamp: Date;
  /** Why it failed or was refused. */
  readonly cause: string | null;
  /** The action's particulars (`{ graceful: true }`, what the BMC was told). */
  readonly detail: Readonly<Record<string, unknown>> | null;
}

/** An operator's action to record (see {@link recordOperatorAction}). */
export interface NewOperatorAction {
  readonly machineId: string;
  readonly action: string;
  readonly outcome: OperatorOutcome;
  readonly actor: string;
  readonly reason?: string | null | undefined;
  readonly cause?: string | null | undefined;
  /** JSON-serializable particulars. */
  readonly detail?: Readonly<Record<string, unknown>> | undefined;
}

const OUTCOMES: readonly string[] = ['Succeeded', 'Failed', 'Refused'];

/**
 * Records what a person did to a machine in its operator history: the
 * shepherd's holds and power actions, or a component's own action (an OS
 * installation requested, cancelled), with outcome, reason, actor, cause
 * and particulars (`detail`, JSON).
 *
 * @throws {@link BMDBError} without an action, actor or a known outcome
 */
export async function recordOperatorAction(db: Kysely<Database>, entry: NewOperatorAction): Promise<void> {
  const what = `operator action ${JSON.stringify(entry.action)} on machine ${entry.machineId}`;
  if (typeof entry.action !== 'string' || entry.action.trim() === '') {
    throw new BMDBError(`operator action on machine ${entry.machineId}: the action must be named`);
  }
  if (!OUTCOMES.includes(entry.outcome)) {
    throw new BMDBError(`${what}: outcome ${JSON.stringify(entry.outcome)} is none of ${OUTCOMES.join(', ')}`);
  }
  checkActor(entry.actor, what);
  await db
    .insertInto('operator_history')
    .values({
      machine_id: entry.machineId,
      action: entry.action,
      outcome: entry.outcome,
      reason: entry.reason ?? null,
      actor: entry.actor,
      cause: entry.cause ?? null,
      detail: entry.detail === undefined ? null : JSON.stringify(entry.detail),
    })
    .execute();
}

/** The actor of an operator action: someone must have done it. */
export function checkActor(actor: unknown, what: string): void {
  if (typeof actor !== 'string' || actor.trim() === '') throw new BMDBError(`${what}: the actor must be named`);
}

/** The reason of an operator action: `why` says what it must tell. */
export function checkReason(reason: unknown, what: string, why: string): void {
  if (typeof reason !== 'string' || reason.trim() === '') throw new BMDBError(`${what}: a reason is needed (${why})`);
}

/** A machine's operator history, oldest first (newest first and at most `limit` if asked). */
export async function operatorHistory(
  db: Kysely<Database>,
  machineId: string,
  options: { newestFirst?: boolean; limit?: number } = {},
): Promise<OperatorHistoryEntry[]> {
  const direction = options.newestFirst ? 'desc' : 'asc';
  let query = db
    .selectFrom('operator_history')
    .selectAll()
    .where('machine_id', '=', machineId)
    .orderBy('timestamp', direction);
  if (options.limit !== undefined) query = query.limit(options.limit);
  return (await query.execute()).map(toOperatorHistoryEntry);
}

export function toOperatorHistoryEntry(row: Selectable<OperatorHistoryTable>): OperatorHistoryEntry {
  return {
    machineId: row.machine_id,
    action: row.action,
    outcome: row.outcome,
    reason: row.reason,
    actor: row.actor,
    timestamp: row.timestamp,
    cause: row.cause,
    detail: isRecord(row.detail) ? row.detail : null,
  };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
