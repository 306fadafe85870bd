/** Work history: every claim's start and end, per machine and process. */

import type { WorkEvent } from '@bmaas/bmdb-controlloop';
import { type Kysely, type Selectable, sql } from 'kysely';
import type { Database } from '../schema.js';

/** One entry of a machine's work history. */
export interface WorkHistoryEntry {
  readonly machineId: string;
  readonly process: string;
  readonly event: WorkEvent;
  readonly timestamp: Date;
  readonly failedCause: string | null;
}

/** A `Failed` history event with the machine's provider ID. */
export interface RecentFailure {
  readonly machineId: string;
  readonly process: string;
  readonly timestamp: Date;
  readonly cause: string | null;
  readonly provider: string | null;
  readonly providerId: string | null;
}

/** A machine's work history, oldest first. */
export async function workHistory(
  db: Kysely<Database>,
  machineId: string,
  options: { process?: string } = {},
): Promise<WorkHistoryEntry[]> {
  let query = db.selectFrom('work_history').selectAll().where('machine_id', '=', machineId);
  if (options.process !== undefined) query = query.where('process', '=', options.process);
  const rows = await query.orderBy('timestamp').orderBy(LIFECYCLE_ORDER).execute();
  return rows.map(toHistoryEntry);
}

/**
 * Events written by one statement share a timestamp; their place in a
 * claim's life (`Canceled` of the one before, `Started`, then its end)
 * breaks the tie.
 */
export const LIFECYCLE_ORDER = sql`array_position(ARRAY['Canceled', 'Started', 'Failed', 'Finished'], event)`;

export function toHistoryEntry(row: Selectable<Database['work_history']>): WorkHistoryEntry {
  return {
    machineId: row.machine_id,
    process: row.process,
    event: row.event,
    timestamp: row.timestamp,
    failedCause: row.failed_cause,
  };
}

/** The fleet's latest `Failed` history events, newest first (index `work_history_failed_idx`). */
export async function recentFailures(db: Kysely<Database>, options: { limit?: number } = {}): Promise<RecentFailure[]> {
  const rows = await db
    .selectFrom('work_history as wh')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'wh.machine_id')
    .select(['wh.machine_id', 'wh.process', 'wh.timestamp', 'wh.failed_cause', 'mp.provider', 'mp.provider_id'])
    .where('wh.event', '=', 'Failed')
    .orderBy('wh.timestamp', 'desc')
    .limit(options.limit ?? 20)
    .execute();
  return rows.map((row) => ({
    machineId: row.machine_id,
    process: row.process,
    timestamp: row.timestamp,
    cause: row.failed_cause,
    provider: row.provider,
    providerId: row.provider_id,
  }));
}
