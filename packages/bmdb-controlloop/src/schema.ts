import type { ColumnType, Generated } from 'kysely';

/**
 * The tables of the control-loop core as Kysely sees them (`bmdb.db`,
 * `Session.transact`, `Work.finish(fn)`): machines, sessions, work, its
 * history and backoffs, and the operators' holds every selection honours.
 * Column names are the database's own (snake_case).
 *
 * A component with tables of its own (its {@link ComponentSchema}) adds
 * them by declaration merging, and every Kysely instance the library hands
 * out then knows them:
 *
 * ```ts
 * declare module '@bmaas/bmdb-controlloop' {
 *   interface Database {
 *     os_install_request: { machine_id: string; image: string };
 *   }
 * }
 * ```
 *
 * `@bmaas/bmdb-model` adds the BMaaS machine model's tables so.
 */
export interface Database {
  machines: MachinesTable;
  sessions: SessionsTable;
  work: WorkTable;
  work_history: WorkHistoryTable;
  work_backoff: WorkBackoffTable;
  machine_hold: MachineHoldTable;
}

/** Timestamps are read as `Date` and written as `Date` or a SQL expression. */
export type Timestamp = ColumnType<Date, Date | string, Date | string>;

export interface MachinesTable {
  machine_id: Generated<string>;
  machine_created_at: Generated<Date>;
  /** Bumped by every claim on the machine (a bigint, read as a string); the library's. */
  claim_version: Generated<string>;
}

export interface SessionsTable {
  session_id: Generated<string>;
  component_name: string;
  runtime_info: string;
  created_at: Generated<Date>;
  interval_seconds: number;
  deadline: Timestamp;
  /** The loop holding the session (`SessionOptions.processor`); null before migration 0004. */
  processor: ColumnType<string | null, string | null | undefined, string | null>;
}

export interface WorkTable {
  machine_id: string;
  session_id: string;
  process: string;
}

/** What happened to a piece of work, as recorded in its history. */
export const WorkEvent = {
  Started: 'Started',
  Finished: 'Finished',
  Failed: 'Failed',
  Canceled: 'Canceled',
} as const;
export type WorkEvent = (typeof WorkEvent)[keyof typeof WorkEvent];

export interface WorkHistoryTable {
  machine_id: string;
  process: string;
  event: WorkEvent;
  timestamp: Timestamp;
  failed_cause: string | null;
}

export interface WorkBackoffTable {
  machine_id: string;
  process: string;
  until: Timestamp;
  cause: string;
  last_interval_seconds: number | null;
}

/**
 * A machine an operator holds (migration 0006): while the row exists, no
 * selection the library builds offers the machine unless it opts in to
 * held machines, so no loop claims it.
 */
export interface MachineHoldTable {
  machine_id: string;
  hold_reason: string;
  /** Who held it (`user@host`, or what `--actor` said). */
  hold_actor: string;
  held_at: Generated<Date>;
  /** Its machine's provider and location (migration 0008), for `fleet_location_totals`; kept by triggers, never write them. */
  provider: Generated<string | null>;
  provider_location: Generated<string | null>;
}
