/**
 * The fleet per provider and location, and the fleet's pulse: what the fleet
 * gauges read (`fleet-metrics.ts`). Every query is served by indexes at
 * 100,000 machines; `npm run bench` (section `fleet`) prints their plans.
 */
import { type Kysely, sql } from 'kysely';
import {
  AGENT_STARTING_PROCESSES,
  type Database,
  type FleetLocationTotalsTable,
  SHEPHERD_PROCESSES,
} from '../schema.js';
import { type FleetControl, type FleetStages, MACHINE_STAGES, type PowerStateCounts } from './fleet-stats.js';
import { type RecoveryThresholds, thresholdSeconds } from './recovery-thresholds.js';

/** Where machines are: a provider and one of its locations (`''`: none recorded). */
export interface MachineLocation {
  readonly provider: string;
  readonly location: string;
}

/** Provided machines of one provider and location, per lifecycle stage (`unprovided` is always 0). */
export interface LocationStages extends MachineLocation {
  readonly stages: FleetStages;
}

/** The fleet per provider and location; machines without a Provided tag have neither. */
export interface StagesByLocation {
  readonly unprovided: number;
  readonly locations: readonly LocationStages[];
}

/** Hardware totals of one provider and location, from the machines' last hardware reports. */
export interface LocationHardware extends MachineLocation {
  /** Machines whose report was read (a report that could not be read counts in none of these). */
  readonly machines: number;
  readonly cpuThreads: number;
  readonly memoryBytes: number;
  /** Block devices. */
  readonly disks: number;
  readonly diskBytes: number;
}

/** An operator's hands on one provider and location: machines held, per power state, whose power read failed. */
export interface LocationControl extends MachineLocation {
  readonly held: number;
  /** Provided machines per power state as last read; `Unread` for those never read. */
  readonly powerStates: PowerStateCounts;
  readonly powerReadFailed: number;
}

/** Live sessions of one component and processor (null: a session from before migration 0004). */
export interface ProcessorSessions {
  readonly componentName: string;
  readonly processor: string | null;
  readonly sessions: number;
}

/** A count of one part of the stage arithmetic, for one provider and location. */
type Part = 'provided' | 'pending' | 'installed' | 'starting' | 'silent' | 'silentLost' | 'stale';

/**
 * Machines per stage, provider and location. As {@link fleetStages}: the
 * provided and the installed machines of each place (from
 * `fleet_location_totals`, a few rows a place, kept by triggers) and the
 * small sets of pending, starting, silent and stale ones, each joined to its
 * machine's Provided tag by key. Its cost grows with those sets, not with the
 * fleet: a fleet of installed machines, most of a serving fleet, is read in
 * its totals' rows. (An installed machine carries no agent tags, a trigger
 * refusing them, so it is in none of the sets.)
 */
export async function fleetStagesByLocation(
  db: Kysely<Database>,
  thresholds: RecoveryThresholds = {},
): Promise<StagesByLocation> {
  const { firstWithin, within } = thresholdSeconds(thresholds);
  const { rows } = await sql<{ part: Part | 'unprovided'; provider: string; location: string; n: number }>`
    SELECT v.part, t.provider, t.location, v.n
    FROM (SELECT provider, provider_location AS location, sum(machines)::int AS machines,
                 sum(installed)::int AS installed
          FROM fleet_location_totals GROUP BY provider, provider_location) t
      CROSS JOIN LATERAL (VALUES ('provided', t.machines), ('installed', t.installed)) AS v (part, n)
    UNION ALL
    SELECT 'pending', mp.provider, coalesce(mp.provider_location, ''), count(*)::int
    FROM machine_agent_pending p JOIN machine_provided mp ON mp.machine_id = p.machine_id
    GROUP BY 2, 3
    UNION ALL
    SELECT 'starting', mp.provider, coalesce(mp.provider_location, ''), count(*)::int
    FROM work w JOIN sessions s ON s.session_id = w.session_id
      JOIN machine_agent_pending p ON p.machine_id = w.machine_id
      JOIN machine_provided mp ON mp.machine_id = w.machine_id
    WHERE w.process IN (${sql.join(AGENT_STARTING_PROCESSES)}) AND s.deadline > now()
    GROUP BY 2, 3
    UNION ALL
    SELECT CASE WHEN a.agent_started_at < now() - make_interval(secs => ${firstWithin})
             THEN 'silentLost' ELSE 'silent' END,
           mp.provider, coalesce(mp.provider_location, ''), count(*)::int
    FROM machine_agent_started a JOIN machine_provided mp ON mp.machine_id = a.machine_id
    WHERE NOT a.has_heartbeat
    GROUP BY 1, 2, 3
    UNION ALL
    SELECT 'stale', mp.provider, coalesce(mp.provider_location, ''), count(*)::int
    FROM machine_agent_heartbeat h JOIN machine_agent_started a ON a.machine_id = h.machine_id
      JOIN machine_provided mp ON mp.machine_id = h.machine_id
    WHERE h.agent_heartbeat_at < now() - make_interval(secs => ${within})
    GROUP BY 2, 3
    UNION ALL
    SELECT 'unprovided', '', '', count(*)::int FROM machine_unprovided`.execute(db);

  let unprovided = 0;
  const parts = new Map<string, MachineLocation & Record<Part, number>>();
  for (const row of rows) {
    if (row.part === 'unprovided') {
      unprovided = row.n;
      continue;
    }
    const key = JSON.stringify([row.provider, row.location]);
    let entry = parts.get(key);
    if (entry === undefined) {
      entry = {
        provider: row.provider,
        location: row.location,
        provided: 0,
        pending: 0,
        installed: 0,
        starting: 0,
        silent: 0,
        silentLost: 0,
        stale: 0,
      };
      parts.set(key, entry);
    }
    entry[row.part] += row.n;
  }
  const locations = [...parts.values()]
    // A place whose machines all went keeps its rows at zero.
    .filter((n) => n.provided > 0)
    .map(({ provider, location, ...n }) => {
      // Split silent into its two stages: silentLost are within silent's count here.
      const silent = n.silent + n.silentLost;
      return {
        provider,
        location,
        stages: {
          unprovided: 0,
          provided: n.pending - n.starting,
          agentStarting: n.starting,
          agentStarted: n.silent,
          heartbeating: n.provided - n.pending - n.installed - silent - n.stale,
          awaitingRecovery: n.silentLost + n.stale,
          installed: n.installed,
        },
      };
    });
  return { unprovided, locations: locations.sort(byLocation) };
}

/**
 * Machines per lifecycle stage for the whole fleet, with the held ones and
 * the provided ones per power state: the sums of {@link fleetStagesByLocation}
 * and {@link controlByLocation} over every place, so the fleet and its places
 * are counted one way.
 */
export async function fleetStages(
  db: Kysely<Database>,
  thresholds: RecoveryThresholds = {},
): Promise<{ machines: number; stages: FleetStages } & FleetControl> {
  const { unprovided, locations } = await fleetStagesByLocation(db, thresholds);
  const control = await controlByLocation(db);
  const stages = Object.fromEntries(
    MACHINE_STAGES.map((stage) => [stage, locations.reduce((sum, place) => sum + place.stages[stage], 0)]),
  ) as Record<keyof FleetStages, number>;
  const total = (count: (place: LocationControl) => number) => control.reduce((sum, place) => sum + count(place), 0);
  return {
    machines: MACHINE_STAGES.reduce((sum, stage) => sum + stages[stage], unprovided),
    held: total((place) => place.held),
    powerStates: {
      On: total((place) => place.powerStates.On),
      Off: total((place) => place.powerStates.Off),
      PoweringOn: total((place) => place.powerStates.PoweringOn),
      PoweringOff: total((place) => place.powerStates.PoweringOff),
      Unknown: total((place) => place.powerStates.Unknown),
      Unread: total((place) => place.powerStates.Unread),
    },
    powerReadFailed: total((place) => place.powerReadFailed),
    stages: { ...stages, unprovided },
  };
}

/**
 * Hardware totals per provider and location, from `fleet_location_totals`
 * (a few rows a place, kept by triggers from each report's totals).
 */
export async function hardwareByLocation(db: Kysely<Database>): Promise<LocationHardware[]> {
  const rows = await placeTotals(db, ['reported_machines', 'cpu_threads', 'memory_bytes', 'disks', 'disk_bytes'])
    .having(sql<boolean>`sum(reported_machines) > 0`)
    .execute();
  return rows.map((row) => ({
    provider: row.provider,
    location: row.provider_location,
    machines: Number(row.reported_machines),
    cpuThreads: Number(row.cpu_threads),
    memoryBytes: Number(row.memory_bytes),
    disks: Number(row.disks),
    diskBytes: Number(row.disk_bytes),
  }));
}

/**
 * Holds, power states and failed power reads per provider and location, from
 * `fleet_location_totals` (kept by triggers on holds and power states, which
 * the power sync's reads of an unchanged state leave alone). A place whose
 * machines all went is left out.
 */
export async function controlByLocation(db: Kysely<Database>): Promise<LocationControl[]> {
  const rows = await placeTotals(db, [
    'held',
    'power_on',
    'power_off',
    'powering_on',
    'powering_off',
    'power_unknown',
    'power_unread',
    'power_read_failed',
  ])
    .having(sql<boolean>`sum(machines) > 0 OR sum(held) > 0`)
    .execute();
  return rows.map((row) => ({
    provider: row.provider,
    location: row.provider_location,
    held: Number(row.held),
    powerStates: {
      On: Number(row.power_on),
      Off: Number(row.power_off),
      PoweringOn: Number(row.powering_on),
      PoweringOff: Number(row.powering_off),
      Unknown: Number(row.power_unknown),
      Unread: Number(row.power_unread),
    },
    powerReadFailed: Number(row.power_read_failed),
  }));
}

/** A total of `fleet_location_totals`: a count, or a sum of the reports' totals. */
type PlaceTotal = Exclude<keyof FleetLocationTotalsTable, 'provider' | 'provider_location' | 'shard'>;

/**
 * `columns` of `fleet_location_totals` summed over each place's rows (sums
 * are numerics, read as strings), in provider and location order.
 */
function placeTotals<C extends PlaceTotal>(db: Kysely<Database>, columns: readonly C[]) {
  return db
    .selectFrom('fleet_location_totals')
    .select(['provider', 'provider_location'])
    .select(columns.map((column) => sql<string>`sum(${sql.ref(column)})`.as(column)))
    .groupBy(['provider', 'provider_location'])
    .orderBy('provider')
    .orderBy('provider_location');
}

/**
 * Running backoffs per process, every shepherd process included (0 when
 * none). The processes are found by a loose index scan of
 * `work_backoff_process_until_idx` and each one's running backoffs counted
 * from the same index's range after now: expired backoffs are not read.
 */
export async function backoffsByProcess(db: Kysely<Database>): Promise<Record<string, number>> {
  const { rows } = await sql<{ process: string; n: number }>`
    WITH RECURSIVE p AS (
      (SELECT process FROM work_backoff ORDER BY process LIMIT 1)
      UNION ALL
      SELECT (SELECT b.process FROM work_backoff b WHERE b.process > p.process ORDER BY b.process LIMIT 1)
      FROM p WHERE p.process IS NOT NULL)
    SELECT p.process,
           (SELECT count(*)::int FROM work_backoff b WHERE b.process = p.process AND b.until > now()) AS n
    FROM p WHERE p.process IS NOT NULL`.execute(db);
  const counts: Record<string, number> = Object.fromEntries(SHEPHERD_PROCESSES.map((process) => [process, 0]));
  for (const row of rows) counts[row.process] = row.n;
  return counts;
}

/** Live sessions per component and processor. */
export async function sessionsByProcessor(db: Kysely<Database>): Promise<ProcessorSessions[]> {
  const rows = await db
    .selectFrom('sessions')
    .select(['component_name', 'processor', sql<number>`count(*)::int`.as('sessions')])
    .where(sql<boolean>`deadline > now()`)
    .groupBy(['component_name', 'processor'])
    .orderBy('component_name')
    .orderBy('processor')
    .execute();
  return rows.map((row) => ({ componentName: row.component_name, processor: row.processor, sessions: row.sessions }));
}

/**
 * Seconds from the newest agent heartbeat to the database's now, undefined
 * when no agent has heartbeated: the one row at the end of
 * `machine_agent_heartbeat_at_idx`.
 */
export async function newestAgentHeartbeatAge(db: Kysely<Database>): Promise<number | undefined> {
  const row = await db
    .selectFrom('machine_agent_heartbeat')
    .select(sql<number | null>`extract(epoch FROM now() - max(agent_heartbeat_at))::float8`.as('age'))
    .executeTakeFirst();
  return row?.age ?? undefined;
}

function byLocation(a: MachineLocation, b: MachineLocation): number {
  return a.provider.localeCompare(b.provider) || a.location.localeCompare(b.location);
}
