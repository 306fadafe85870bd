/** The fleet at a glance: machines per stage, live work, sessions and providers. */

import { hasLiveWork } from '@bmaas/bmdb-controlloop';
import { type Kysely, type RawBuilder, sql } from 'kysely';
import { AGENT_STARTING_PROCESSES, type Database, type PowerState } from '../schema.js';
import { lostAgent, type RecoveryThresholds } from './recovery-thresholds.js';

/** Machines per lifecycle stage; each machine counts in exactly one stage. */
export interface FleetStages {
  /** Machines without a Provided tag (rare: a half-created machine). */
  readonly unprovided: number;
  /** Provided, agent not started, no agent start under way (whichever its boot method). */
  readonly provided: number;
  /** Provided, agent not started, an agent start or an agent boot claimed right now. */
  readonly agentStarting: number;
  /** Agent started, no heartbeat yet, still within the first-heartbeat threshold. */
  readonly agentStarted: number;
  /** Agent heartbeating within the threshold. */
  readonly heartbeating: number;
  /** Agent started but silent past a threshold: a recovery candidate. */
  readonly awaitingRecovery: number;
  /** Provided, no agent: its OS installation succeeded and it runs that OS; no loop takes it up. */
  readonly installed: number;
}

/**
 * Provided machines per power state as last read; `Unread` for those never
 * read. Each provided machine counts in exactly one.
 */
export type PowerStateCounts = Readonly<Record<PowerState | 'Unread', number>>;

/** Holds and power states across the fleet. */
export interface FleetControl {
  /** Machines an operator holds. */
  readonly held: number;
  readonly powerStates: PowerStateCounts;
  /** Provided machines whose last power state read failed. */
  readonly powerReadFailed: number;
}

/** The fleet at a glance. */
export interface FleetStats extends FleetControl {
  readonly machines: number;
  readonly stages: FleetStages;
  /** Live work items (held by unexpired sessions), per process. */
  readonly activeWork: Readonly<Record<string, number>>;
  /** Backoffs still running, per process. */
  readonly activeBackoffs: Readonly<Record<string, number>>;
}

/** Where a machine stands in its life: a key of {@link FleetStages}. Each machine is in exactly one. */
export type MachineStage = keyof FleetStages;

/** Every stage, in lifecycle order. */
export const MACHINE_STAGES: readonly MachineStage[] = [
  'unprovided',
  'provided',
  'agentStarting',
  'agentStarted',
  'heartbeating',
  'awaitingRecovery',
  'installed',
];

/** Whether the machine at `machineId` is installed: its OS installation request succeeded. A key probe. */
export function isInstalled(machineId: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (SELECT 1 FROM machine_os_installation_request iq
    WHERE iq.machine_id = ${sql.ref(machineId)} AND iq.installation_state = 'Succeeded')`;
}

/** A session whose deadline has not passed: a live process using the BMDB. */
export interface LiveSession {
  readonly sessionId: string;
  readonly componentName: string;
  readonly runtimeInfo: string;
  /** The loop holding it (`shepherd-initializer`); null for sessions from before migration 0004. */
  readonly processor: string | null;
  readonly createdAt: Date;
  readonly intervalSeconds: number;
  readonly deadline: Date;
  /** Work items it holds. */
  readonly work: number;
}

/**
 * Machines per lifecycle stage, live work and running backoffs per process.
 * A full scan: meant for status pages, not for control loops.
 */
export async function fleetStats(
  db: Kysely<Database>,
  options: { provider?: string } & RecoveryThresholds = {},
): Promise<FleetStats> {
  const provider = options.provider;
  const stageRow = await db
    .selectFrom('machines as m')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
    .leftJoin('machine_agent_started as a', 'a.machine_id', 'm.machine_id')
    .leftJoin('machine_agent_heartbeat as h', 'h.machine_id', 'm.machine_id')
    .$if(provider !== undefined, (qb) => qb.where('mp.provider', '=', provider as string))
    .select([
      sql<number>`count(*)::int`.as('machines'),
      sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NULL))::int`.as('unprovided'),
      sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NOT NULL AND a.machine_id IS NULL
        AND NOT ${isInstalled('m.machine_id')}
        AND NOT ${hasLiveWork('m.machine_id', AGENT_STARTING_PROCESSES)}))::int`.as('provided'),
      sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NOT NULL AND a.machine_id IS NULL
        AND ${isInstalled('m.machine_id')}))::int`.as('installed'),
      sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NOT NULL AND a.machine_id IS NULL
        AND NOT ${isInstalled('m.machine_id')}
        AND ${hasLiveWork('m.machine_id', AGENT_STARTING_PROCESSES)}))::int`.as('agent_starting'),
      sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND h.machine_id IS NULL
        AND NOT ${lostAgent(options)}))::int`.as('agent_started'),
      sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND h.machine_id IS NOT NULL
        AND NOT ${lostAgent(options)}))::int`.as('heartbeating'),
      sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND ${lostAgent(options)}))::int`.as(
        'awaiting_recovery',
      ),
    ])
    .executeTakeFirstOrThrow();

  const activeWork = await liveWorkByProcess(db);
  const backoffs = await db
    .selectFrom('work_backoff')
    .select(['process', sql<number>`count(*)::int`.as('count')])
    .where(sql<boolean>`until > now()`)
    .groupBy('process')
    .orderBy('process')
    .execute();

  const control = await db
    .selectFrom('machine_power_state')
    .select(['power_state', sql<number>`count(*)::int`.as('count')])
    .$if(provider !== undefined, (qb) => qb.where('provider', '=', provider as string))
    .groupBy('power_state')
    .execute();
  const ofProvider = (machineId: string) =>
    provider === undefined
      ? sql<boolean>`true`
      : sql<boolean>`EXISTS (SELECT 1 FROM machine_provided fp WHERE fp.machine_id = ${sql.ref(machineId)}
          AND fp.provider = ${provider})`;
  const counts = await sql<{ held: number; read_failed: number }>`SELECT
      (SELECT count(*)::int FROM machine_hold hd WHERE ${ofProvider('hd.machine_id')}) AS held,
      (SELECT count(*)::int FROM machine_power_state ps
       WHERE ps.power_read_failed_at IS NOT NULL AND ${ofProvider('ps.machine_id')}) AS read_failed`.execute(db);
  const powerStates = { ...NO_POWER_STATES };
  for (const row of control) powerStates[row.power_state ?? 'Unread'] = row.count;

  return {
    machines: stageRow.machines,
    held: counts.rows[0]?.held ?? 0,
    powerStates,
    powerReadFailed: counts.rows[0]?.read_failed ?? 0,
    stages: {
      unprovided: stageRow.unprovided,
      provided: stageRow.provided,
      agentStarting: stageRow.agent_starting,
      agentStarted: stageRow.agent_started,
      heartbeating: stageRow.heartbeating,
      awaitingRecovery: stageRow.awaiting_recovery,
      installed: stageRow.installed,
    },
    activeWork,
    activeBackoffs: Object.fromEntries(backoffs.map((row) => [row.process, row.count])),
  };
}

const NO_POWER_STATES: Record<PowerState | 'Unread', number> = {
  On: 0,
  Off: 0,
  PoweringOn: 0,
  PoweringOff: 0,
  Unknown: 0,
  Unread: 0,
};

/** The database's clock: what ages and "time left" on status pages are measured from. */
export async function databaseNow(db: Kysely<Database>): Promise<Date> {
  const row = await db.selectNoFrom(sql<Date>`now()`.as('now')).executeTakeFirstOrThrow();
  return row.now;
}

/**
 * The providers machines are provided by, sorted. One index probe per
 * provider (a loose index scan), not a scan of every machine.
 */
export async function providers(db: Kysely<Database>): Promise<string[]> {
  const { rows } = await sql<{ provider: string }>`
    WITH RECURSIVE p AS (
      (SELECT provider FROM machine_provided ORDER BY provider LIMIT 1)
      UNION ALL
      SELECT (SELECT mp.provider FROM machine_provided mp WHERE mp.provider > p.provider
              ORDER BY mp.provider LIMIT 1)
      FROM p WHERE p.provider IS NOT NULL)
    SELECT provider FROM p WHERE provider IS NOT NULL`.execute(db);
  return rows.map((row) => row.provider);
}

/** How many machines each provider has in the BMDB, by provider name. */
export async function machinesPerProvider(db: Kysely<Database>): Promise<Record<string, number>> {
  const rows = await db
    .selectFrom('machine_provided')
    .select(['provider', sql<number>`count(*)::int`.as('machines')])
    .groupBy('provider')
    .orderBy('provider')
    .execute();
  return Object.fromEntries(rows.map((row) => [row.provider, row.machines]));
}

/** Live work items (held by unexpired sessions), per process. */
export async function liveWorkByProcess(db: Kysely<Database>): Promise<Record<string, number>> {
  const rows = await db
    .selectFrom('work as w')
    .innerJoin('sessions as s', 's.session_id', 'w.session_id')
    .select(['w.process', sql<number>`count(*)::int`.as('count')])
    .where(sql<boolean>`s.deadline > now()`)
    .groupBy('w.process')
    .orderBy('w.process')
    .execute();
  return Object.fromEntries(rows.map((row) => [row.process, row.count]));
}

/** Sessions whose deadline has not passed (which processes are alive), oldest first, with their live work. */
export async function liveSessions(db: Kysely<Database>): Promise<LiveSession[]> {
  const rows = await db
    .selectFrom('sessions as s')
    .select([
      's.session_id',
      's.component_name',
      's.runtime_info',
      's.processor',
      's.created_at',
      's.interval_seconds',
      's.deadline',
      sql<number>`(SELECT count(*)::int FROM work w WHERE w.session_id = s.session_id)`.as('work'),
    ])
    .where(sql<boolean>`s.deadline > now()`)
    .orderBy('s.created_at')
    .orderBy('s.session_id')
    .execute();
  return rows.map((row) => ({
    sessionId: row.session_id,
    componentName: row.component_name,
    runtimeInfo: row.runtime_info,
    processor: row.processor,
    createdAt: row.created_at,
    intervalSeconds: row.interval_seconds,
    deadline: row.deadline,
    work: row.work,
  }));
}
