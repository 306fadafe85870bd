/** Backoffs: per machine, running across the fleet, and grouped by cause. */
import { type Kysely, sql } from 'kysely';
import type { Database } from '../schema.js';

/** A (machine, process) backoff. */
export interface WorkBackoffEntry {
  readonly machineId: string;
  readonly process: string;
  readonly until: Date;
  readonly cause: string;
  readonly lastIntervalSeconds: number | null;
  /** Whether `until` is still in the future (by the database's clock). */
  readonly active: boolean;
}

/** A running backoff with the machine's provider, as a status report lists it. */
export interface ActiveBackoff extends WorkBackoffEntry {
  /** The machine's provider and provider ID; null when it has no Provided tag. */
  readonly provider: string | null;
  readonly providerId: string | null;
  /** Whole seconds until `until`, rounded up, by the database's clock. */
  readonly secondsLeft: number;
}

/** Machines backing off for one process with the same cause (IDs and addresses aside). */
export interface BackoffCause {
  readonly process: string;
  readonly cause: string;
  readonly machines: number;
  readonly soonestUntil: Date;
  readonly latestUntil: Date;
  /** The machine whose backoff runs longest, as an example to look at. */
  readonly exampleMachineId: string;
  /** Its cause as recorded, with its IDs and addresses. */
  readonly exampleCause: string;
}

/** Machine IDs and IPv4 addresses in failure causes, replaced to group causes (PostgreSQL regular expressions). */
const CAUSE_UUID = '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}';
const CAUSE_ADDRESS = '\\m[0-9]{1,3}(\\.[0-9]{1,3}){3}(:[0-9]{1,5})?\\M';

/** A machine's backoffs (running or not), by process. */
export async function workBackoffs(db: Kysely<Database>, machineId: string): Promise<WorkBackoffEntry[]> {
  const rows = await db
    .selectFrom('work_backoff')
    .selectAll()
    .select(sql<boolean>`until > now()`.as('active'))
    .where('machine_id', '=', machineId)
    .orderBy('process')
    .execute();
  return rows.map(toBackoffEntry);
}

/**
 * Running backoffs across the fleet, soonest to end first, with each
 * machine's provider ID and the seconds left.
 */
export async function activeBackoffs(
  db: Kysely<Database>,
  options: { process?: string; limit?: number } = {},
): Promise<ActiveBackoff[]> {
  let query = db
    .selectFrom('work_backoff as b')
    .leftJoin('machine_provided as p', 'p.machine_id', 'b.machine_id')
    .selectAll('b')
    .select([
      'p.provider',
      'p.provider_id',
      sql<boolean>`true`.as('active'),
      sql<number>`ceil(extract(epoch FROM b.until - now()))::int`.as('seconds_left'),
    ])
    .where(sql<boolean>`b.until > now()`);
  if (options.process !== undefined) query = query.where('b.process', '=', options.process);
  const rows = await query
    .orderBy('b.until')
    .limit(options.limit ?? 100)
    .execute();
  return rows.map((row) => ({
    ...toBackoffEntry(row),
    provider: row.provider,
    providerId: row.provider_id,
    secondsLeft: row.seconds_left,
  }));
}

/**
 * Running backoffs grouped by process and cause, the most machines first:
 * how many machines fail for the same reason. Causes often name their
 * machine; UUIDs and IPv4 addresses (with a port) in them are replaced by
 * `<id>` and `<address>` first, so one failure on many machines is one
 * group.
 */
export async function backoffCauses(db: Kysely<Database>, options: { limit?: number } = {}): Promise<BackoffCause[]> {
  const { rows } = await sql<{
    process: string;
    cause: string;
    machines: number;
    soonest_until: Date;
    latest_until: Date;
    example_machine_id: string;
    example_cause: string;
  }>`
    SELECT process, cause, count(*)::int AS machines, min(until) AS soonest_until, max(until) AS latest_until,
           (array_agg(machine_id ORDER BY until DESC))[1] AS example_machine_id,
           (array_agg(original ORDER BY until DESC))[1] AS example_cause
    FROM (
      SELECT process, machine_id, until, cause AS original,
             regexp_replace(
               regexp_replace(cause, ${CAUSE_UUID}, '<id>', 'g'),
               ${CAUSE_ADDRESS}, '<address>', 'g') AS cause
      FROM work_backoff WHERE until > now()) AS running
    GROUP BY process, cause
    ORDER BY machines DESC, process, cause
    LIMIT ${options.limit ?? 20}`.execute(db);
  return rows.map((row) => ({
    process: row.process,
    cause: row.cause,
    machines: row.machines,
    soonestUntil: row.soonest_until,
    latestUntil: row.latest_until,
    exampleMachineId: row.example_machine_id,
    exampleCause: row.example_cause,
  }));
}

function toBackoffEntry(row: {
  machine_id: string;
  process: string;
  until: Date;
  cause: string;
  last_interval_seconds: number | null;
  active: boolean;
}): WorkBackoffEntry {
  return {
    machineId: row.machine_id,
    process: row.process,
    until: row.until,
    cause: row.cause,
    lastIntervalSeconds: row.last_interval_seconds,
    active: row.active,
  };
}
