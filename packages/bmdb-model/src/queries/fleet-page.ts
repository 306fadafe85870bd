import { hasLiveWork } from '@bmaas/bmdb-controlloop';
import { isUuid } from '@bmaas/common';
/** The fleet page's machine table and machine detail. */
import { type Kysely, type RawBuilder, sql } from 'kysely';
import { type MachineHardware, machineHardware } from '../hardware-report.js';
import {
  AGENT_STARTING_PROCESSES,
  type AgentBootMethod,
  type Database,
  type OSInstallationState,
  type PowerState,
  type ProviderStatus,
} from '../schema.js';
import { type WorkBackoffEntry, workBackoffs } from './backoffs.js';
import { isInstalled, type MachineStage } from './fleet-stats.js';
import { LIFECYCLE_ORDER, toHistoryEntry, type WorkHistoryEntry } from './history.js';
import type { MachineHold } from './holds.js';
import { drivingIds, type MachineFilter, powerStateIs, searchCondition } from './machine-filter.js';
import { type OperatorHistoryEntry, operatorHistory } from './operator-history.js';
import { type OSInstallation, osInstallation } from './os-installation.js';
import { type PowerStateRecord, toPowerStateRecord } from './power-state.js';
import { type ProvidedMachine, toProvidedMachine } from './provided-tags.js';
import { lostAgent, type RecoveryThresholds } from './recovery-thresholds.js';

/** A machine as a fleet table shows it. */
export interface MachineSummary {
  readonly machineId: string;
  readonly createdAt: Date;
  readonly stage: MachineStage;
  /** The Provided tag, if any. */
  readonly provided: ProvidedMachine | undefined;
  readonly agentStartedAt: Date | null;
  readonly lastHeartbeatAt: Date | null;
  /** Processes with live work on the machine. */
  readonly liveWork: readonly string[];
  /** Processes with a running backoff on the machine. */
  readonly backoffs: readonly string[];
  /** The cause of the running backoff that lasts longest, if any. */
  readonly backoffCause: string | null;
  /** An operator's hold on the machine, if any. */
  readonly hold: MachineHold | null;
  /** The power state last read (`null`: never read, or not provided) and when. */
  readonly powerState: PowerState | null;
  readonly powerStateReadAt: Date | null;
  /** Where its OS installation request stands, and its generation; `null`: never requested. */
  readonly installation: { readonly state: OSInstallationState; readonly generation: bigint } | null;
}

/** One page of {@link machinePage}. */
export interface MachinePage {
  readonly machines: readonly MachineSummary[];
  /** Pass as `after` for the next page; `undefined` on the last. */
  readonly next: string | undefined;
}

/** Live work on a machine and who holds it. */
export interface LiveWorkItem {
  readonly process: string;
  readonly sessionId: string;
  readonly processor: string | null;
  readonly componentName: string;
  readonly sessionDeadline: Date;
  /** When the work started (its latest `Started` event), if recorded. */
  readonly since: Date | null;
}

/** One machine's whole story (see {@link machineDetail}). */
export interface MachineDetail extends Omit<MachineSummary, 'liveWork' | 'backoffs'> {
  /** The last power state read, with its failure if the last read failed; `null` for an unprovided machine. */
  readonly power: PowerStateRecord | null;
  /** Its OS installation request (generation, image, delivered, outcome, error), if one was ever made. */
  readonly osInstallation: OSInstallation | null;
  /** What people did to the machine (holds, power actions), newest first, up to `historyLimit` entries. */
  readonly operatorHistory: readonly OperatorHistoryEntry[];
  /** Its last hardware report, decoded (system, boot, memory, CPUs, disks, NICs), if its agent sent one. */
  readonly hardware: MachineHardware | null;
  /** The agent's public key (AgentStarted tag), if started. */
  readonly agentPublicKey: Uint8Array | null;
  /** How its agent arrives: `ssh` (a takeover), or booted by its BMC from `virtual-media` or the `network`. */
  readonly agentBoot: AgentBootMethod;
  /** The tail of its agent's log (at most 64 KiB) as the last heartbeat carrying one sent it, and when that was received. */
  readonly agentLog: { readonly text: string; readonly receivedAt: Date } | null;
  readonly liveWork: readonly LiveWorkItem[];
  /** Every backoff of the machine, running (`active`) or expired, by process. */
  readonly backoffs: readonly WorkBackoffEntry[];
  /** The newest history entries, newest first. */
  readonly history: readonly WorkHistoryEntry[];
  /** How many history entries the machine has in all. */
  readonly historyTotal: number;
}

/**
 * The machine a person means by `id`: a machine ID, or a provider ID known
 * to exactly one provider. `undefined` when none or several match.
 */
export async function findMachine(db: Kysely<Database>, id: string): Promise<string | undefined> {
  const trimmed = id.trim();
  if (isUuid(trimmed)) {
    const row = await db
      .selectFrom('machines')
      .select('machine_id')
      .where('machine_id', '=', trimmed.toLowerCase())
      .executeTakeFirst();
    if (row) return row.machine_id;
  }
  const rows = await db
    .selectFrom('machine_provided')
    .select('machine_id')
    .where('provider_id', '=', trimmed)
    .limit(2)
    .execute();
  return rows.length === 1 ? rows[0]?.machine_id : undefined;
}

/**
 * One page of machines matching `filter`, in machine ID order, from
 * `filter.after` (keyset pagination: pass the page's `next` to get the
 * next). Each filter is served by an index: the most selective one given
 * chooses the rows read, the others are checked on them.
 */
export async function machinePage(
  db: Kysely<Database>,
  filter: MachineFilter = {},
  thresholds: RecoveryThresholds = {},
): Promise<MachinePage> {
  const limit = filter.limit ?? 50;
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000)
    throw new RangeError(`machinePage: limit must be a whole number from 1 to 1000, got ${limit}`);
  if (filter.after !== undefined && !isUuid(filter.after))
    throw new RangeError(`machinePage: after must be a machine ID (a UUID), got ${JSON.stringify(filter.after)}`);
  const search = filter.search?.trim() || undefined;
  // The page's IDs first, from the rows of the index serving the filter that
  // chooses them, every other filter checked per ID by key: the planner can
  // stop after `limit + 1` matches in ID order, and the columns are then
  // read for those IDs only. DISTINCT: a machine may come from two rows
  // (backoffs of two processes, a search matching both IDs).
  const conditions: RawBuilder<boolean>[] = [];
  if (filter.after !== undefined) conditions.push(sql<boolean>`ids.machine_id > ${filter.after}::uuid`);
  if (filter.provider !== undefined) {
    conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM machine_provided fp
      WHERE fp.machine_id = ids.machine_id AND fp.provider = ${filter.provider})`);
  }
  if (filter.liveWork !== undefined) conditions.push(hasLiveWork('ids.machine_id', [filter.liveWork]));
  if (filter.inBackoff !== undefined) {
    conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM work_backoff fb WHERE fb.machine_id = ids.machine_id
      AND fb.until > now() ${filter.inBackoff === true ? sql`` : sql`AND fb.process = ${filter.inBackoff}`})`);
  }
  if (filter.held !== undefined) {
    conditions.push(
      sql<boolean>`${filter.held ? sql`` : sql`NOT`} EXISTS (SELECT 1 FROM machine_hold fh WHERE fh.machine_id = ids.machine_id)`,
    );
  }
  if (filter.powerState !== undefined) {
    conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM machine_power_state fps
      WHERE fps.machine_id = ids.machine_id AND ${powerStateIs('fps', filter.powerState)})`);
  }
  if (filter.installation !== undefined) {
    conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM machine_os_installation_request fi
      WHERE fi.machine_id = ids.machine_id AND fi.installation_state = ${filter.installation})`);
  }
  if (search !== undefined && filter.stage !== undefined) conditions.push(searchCondition(search));
  const { rows } = await sql<MachineSummaryRow>`
    SELECT ${machineColumns(thresholds)}
    FROM (
      SELECT DISTINCT ids.machine_id FROM ${drivingIds(filter, search, thresholds)} AS ids
      WHERE ${conditions.length === 0 ? sql`true` : sql.join(conditions, sql` AND `)}
      ORDER BY ids.machine_id
      LIMIT ${limit + 1}) AS page
    JOIN machines m ON m.machine_id = page.machine_id
    LEFT JOIN machine_provided mp ON mp.machine_id = m.machine_id
    LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
    LEFT JOIN machine_hold hd ON hd.machine_id = m.machine_id
    LEFT JOIN machine_power_state ps ON ps.machine_id = m.machine_id
    LEFT JOIN machine_os_installation_request iq ON iq.machine_id = m.machine_id
    ORDER BY m.machine_id`.execute(db);
  const machines = rows.slice(0, limit).map(toMachineSummary);
  return { machines, next: rows.length > limit ? machines.at(-1)?.machineId : undefined };
}

/**
 * Everything known about one machine: its tags and stage, live work, every
 * backoff (running or expired) and its work history, newest first, up to
 * `historyLimit` entries (default 500; `historyTotal` says how many exist).
 */
export async function machineDetail(
  db: Kysely<Database>,
  machineId: string,
  options: { historyLimit?: number } & RecoveryThresholds = {},
): Promise<MachineDetail | undefined> {
  if (!isUuid(machineId)) return undefined;
  const { rows } = await sql<
    MachineSummaryRow & {
      agent_public_key: Uint8Array | null;
      power_row: string | null;
      power_read_failed_at: Date | null;
      power_read_failed_cause: string | null;
      agent_log: string | null;
      agent_log_received_at: Date | null;
      boot_method: Exclude<AgentBootMethod, 'ssh'> | null;
    }
  >`
    SELECT ${machineColumns(options)}, a.agent_public_key, ps.machine_id AS power_row, ps.power_read_failed_at,
      ps.power_read_failed_cause, al.agent_log, al.agent_log_received_at, ab.boot_method
    FROM machines m
    LEFT JOIN machine_provided mp ON mp.machine_id = m.machine_id
    LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
    LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
    LEFT JOIN machine_hold hd ON hd.machine_id = m.machine_id
    LEFT JOIN machine_power_state ps ON ps.machine_id = m.machine_id
    LEFT JOIN machine_os_installation_request iq ON iq.machine_id = m.machine_id
    LEFT JOIN machine_agent_log al ON al.machine_id = m.machine_id
    LEFT JOIN machine_agent_boot ab ON ab.machine_id = m.machine_id
    WHERE m.machine_id = ${machineId}::uuid`.execute(db);
  const row = rows[0];
  if (row === undefined) return undefined;
  const work = await db
    .selectFrom('work as w')
    .innerJoin('sessions as s', 's.session_id', 'w.session_id')
    .select([
      'w.process',
      'w.session_id',
      's.processor',
      's.component_name',
      's.deadline',
      sql<Date | null>`(SELECT max(wh."timestamp") FROM work_history wh
        WHERE wh.machine_id = w.machine_id AND wh.process = w.process AND wh.event = 'Started')`.as('since'),
    ])
    .where('w.machine_id', '=', machineId)
    .where(sql<boolean>`s.deadline > now()`)
    .orderBy('w.process')
    .execute();
  const historyLimit = options.historyLimit ?? 500;
  const history = await db
    .selectFrom('work_history')
    .selectAll()
    .where('machine_id', '=', machineId)
    .orderBy('timestamp', 'desc')
    .orderBy(LIFECYCLE_ORDER, 'desc')
    .limit(historyLimit)
    .execute();
  const total = await db
    .selectFrom('work_history')
    .select(sql<number>`count(*)::int`.as('count'))
    .where('machine_id', '=', machineId)
    .executeTakeFirstOrThrow();
  const hardware = await db
    .selectFrom('machine_hardware_report')
    .select(['hardware_report_raw', 'hardware_reported_at'])
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return {
    ...toMachineSummary(row),
    hardware: hardware ? machineHardware(hardware.hardware_report_raw, hardware.hardware_reported_at) : null,
    agentPublicKey: row.agent_public_key,
    agentBoot: row.boot_method ?? 'ssh',
    agentLog:
      row.agent_log === null || row.agent_log_received_at === null
        ? null
        : { text: row.agent_log, receivedAt: row.agent_log_received_at },
    power:
      row.power_row === null
        ? null
        : toPowerStateRecord({
            machine_id: row.machine_id,
            power_state: row.power_state,
            power_state_read_at: row.power_state_read_at,
            power_read_failed_at: row.power_read_failed_at,
            power_read_failed_cause: row.power_read_failed_cause,
          }),
    osInstallation: (await osInstallation(db, machineId)) ?? null,
    operatorHistory: await operatorHistory(db, machineId, { newestFirst: true, limit: historyLimit }),
    liveWork: work.map((w) => ({
      process: w.process,
      sessionId: w.session_id,
      processor: w.processor,
      componentName: w.component_name,
      sessionDeadline: w.deadline,
      since: w.since,
    })),
    backoffs: await workBackoffs(db, machineId),
    history: history.map(toHistoryEntry),
    historyTotal: total.count,
  };
}

/** A machine's stage, over aliases `m`, `mp`, `a` and `h`; the order of {@link FleetStages}' definitions. */
function stageOf(thresholds: RecoveryThresholds): RawBuilder<MachineStage> {
  return sql<MachineStage>`CASE
    WHEN mp.machine_id IS NULL THEN 'unprovided'
    WHEN a.machine_id IS NULL THEN
      CASE WHEN ${isInstalled('m.machine_id')} THEN 'installed'
           WHEN ${hasLiveWork('m.machine_id', AGENT_STARTING_PROCESSES)} THEN 'agentStarting' ELSE 'provided' END
    WHEN ${lostAgent(thresholds)} THEN 'awaitingRecovery'
    WHEN h.machine_id IS NULL THEN 'agentStarted'
    ELSE 'heartbeating' END`;
}

interface MachineSummaryRow {
  machine_id: string;
  machine_created_at: Date;
  provider: string | null;
  provider_id: string | null;
  provider_reservation_id: string | null;
  provider_ip_address: string | null;
  provider_location: string | null;
  provider_status: ProviderStatus | null;
  agent_started_at: Date | null;
  agent_heartbeat_at: Date | null;
  stage: MachineStage;
  live_work: string[];
  backoffs: string[];
  backoff_cause: string | null;
  hold_reason: string | null;
  hold_actor: string | null;
  held_at: Date | null;
  power_state: PowerState | null;
  power_state_read_at: Date | null;
  installation_state: OSInstallationState | null;
  installation_generation: string | null;
}

/**
 * The columns of {@link MachineSummaryRow}, over aliases `m`, `mp`, `a`, `h`, `hd` (hold), `ps` (power
 * state) and `iq` (installation request); each subquery reads one machine's rows.
 */
function machineColumns(thresholds: RecoveryThresholds): RawBuilder<unknown> {
  return sql`m.machine_id, m.machine_created_at, mp.provider, mp.provider_id, mp.provider_reservation_id,
    mp.provider_ip_address, mp.provider_location, mp.provider_status, a.agent_started_at, h.agent_heartbeat_at,
    hd.hold_reason, hd.hold_actor, hd.held_at, ps.power_state, ps.power_state_read_at,
    iq.installation_state, iq.generation AS installation_generation,
    ${stageOf(thresholds)} AS stage,
    ARRAY(SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
      WHERE w.machine_id = m.machine_id AND s.deadline > now() ORDER BY w.process) AS live_work,
    ARRAY(SELECT b.process FROM work_backoff b
      WHERE b.machine_id = m.machine_id AND b.until > now() ORDER BY b.process) AS backoffs,
    (SELECT b.cause FROM work_backoff b
      WHERE b.machine_id = m.machine_id AND b.until > now() ORDER BY b.until DESC LIMIT 1) AS backoff_cause`;
}

function toMachineSummary(row: MachineSummaryRow): MachineSummary {
  return {
    machineId: row.machine_id,
    createdAt: row.machine_created_at,
    stage: row.stage,
    provided:
      row.provider === null || row.provider_id === null
        ? undefined
        : toProvidedMachine({ ...row, provider: row.provider, provider_id: row.provider_id }),
    agentStartedAt: row.agent_started_at,
    lastHeartbeatAt: row.agent_heartbeat_at,
    liveWork: row.live_work,
    backoffs: row.backoffs,
    backoffCause: row.backoff_cause,
    hold:
      row.hold_reason === null || row.hold_actor === null || row.held_at === null
        ? null
        : { machineId: row.machine_id, reason: row.hold_reason, actor: row.hold_actor, since: row.held_at },
    powerState: row.power_state,
    powerStateReadAt: row.power_state_read_at,
    installation:
      row.installation_state === null || row.installation_generation === null
        ? null
        : { state: row.installation_state, generation: BigInt(row.installation_generation) },
  };
}
