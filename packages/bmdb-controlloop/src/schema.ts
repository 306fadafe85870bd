import type { ColumnType, Generated, Insertable, Selectable } from 'kysely';

/**
 * The BMDB schema as Kysely sees it, for callers who write their own queries
 * with `Queries.db`. Column names are the database's own (snake_case).
 */
export interface Database {
  machines: MachinesTable;
  machine_provided: MachineProvidedTable;
  machine_agent_started: MachineAgentStartedTable;
  machine_agent_heartbeat: MachineAgentHeartbeatTable;
  machine_agent_pending: MachineAgentPendingTable;
  machine_hardware_report: MachineHardwareReportTable;
  machine_os_installation_report: MachineOsInstallationReportTable;
  machine_unprovided: MachineUnprovidedTable;
  fleet_location_totals: FleetLocationTotalsTable;
  sessions: SessionsTable;
  work: WorkTable;
  work_history: WorkHistoryTable;
  work_backoff: WorkBackoffTable;
}

/** Timestamps are read as `Date` and written as `Date` or a SQL expression. */
type Timestamp = ColumnType<Date, Date | string, Date | string>;

export interface MachinesTable {
  machine_id: Generated<string>;
  machine_created_at: Generated<Date>;
  /** Bumped by every claim on the machine (a bigint, read as a string); the library's. */
  claim_version: Generated<string>;
}

/** Where a machine's provider status stands; `null` until first observed. */
export const ProviderStatus = {
  Missing: 'Missing',
  Provisioning: 'Provisioning',
  ProvisioningFailedPermanent: 'ProvisioningFailedPermanent',
  Running: 'Running',
  Stopped: 'Stopped',
  Unknown: 'Unknown',
} as const;
export type ProviderStatus = (typeof ProviderStatus)[keyof typeof ProviderStatus];

export interface MachineProvidedTable {
  machine_id: string;
  provider: string;
  provider_id: string;
  provider_reservation_id: string | null;
  provider_ip_address: string | null;
  provider_location: string | null;
  provider_status: ProviderStatus | null;
}

/**
 * Provided machines without an AgentStarted tag, by provider: what the
 * agent-start selection reads. Kept by triggers; never written by hand.
 */
export interface MachineAgentPendingTable {
  machine_id: string;
  provider: string;
}

/** Machines without a Provided tag (migration 0004). Kept by triggers; never written by hand. */
export interface MachineUnprovidedTable {
  machine_id: string;
}

/**
 * Per provider and location (`''` for none), spread over 64 rows (`shard`):
 * provided machines and the sums of their hardware reports' totals
 * (migration 0008). Kept by triggers; never written by hand. Sum a place's
 * rows to read it. Numerics and bigints are read as strings.
 */
export interface FleetLocationTotalsTable {
  provider: string;
  provider_location: string;
  shard: number;
  machines: string;
  reported_machines: string;
  cpu_threads: string;
  memory_bytes: string;
  disks: string;
  disk_bytes: string;
}

export interface MachineAgentStartedTable {
  machine_id: string;
  agent_started_at: Timestamp;
  agent_public_key: Uint8Array;
  /** Whether an AgentHeartbeat row exists; kept by triggers, for the recovery index. Never write it. */
  has_heartbeat: Generated<boolean>;
}

export interface MachineAgentHeartbeatTable {
  machine_id: string;
  agent_heartbeat_at: Timestamp;
}

/** The agent's last hardware report (a serialized `cloud.bmaas.server.api.AgentHardwareReport`). */
export interface MachineHardwareReportTable {
  machine_id: string;
  hardware_report_raw: Uint8Array;
  hardware_reported_at: Timestamp;
  /** Its machine's provider and location (migration 0008), for `fleet_location_totals`; kept by triggers, never write them. */
  provider: Generated<string | null>;
  provider_location: Generated<string | null>;
  /**
   * The report's totals (migration 0008), read from it by
   * `BMDB.recordAgentHeartbeat` as it stores it; null when it could not be
   * read. Bigints are read as strings.
   */
  cpu_threads: Generated<string | null>;
  memory_bytes: Generated<string | null>;
  disks: Generated<number | null>;
  disk_bytes: Generated<string | null>;
}

/** How an OS installation the agent was asked for ended. */
export const OSInstallationResult = { Success: 'Success', Error: 'Error' } as const;
export type OSInstallationResult = (typeof OSInstallationResult)[keyof typeof OSInstallationResult];

/** The agent's last OS installation report (a serialized `cloud.bmaas.server.api.OSInstallationReport`). */
export interface MachineOsInstallationReportTable {
  machine_id: string;
  /** The request's generation (a bigint, read as a string). */
  generation: ColumnType<string, string | bigint, string | bigint>;
  os_installation_result: OSInstallationResult;
  os_installation_report_raw: Uint8Array;
  os_installation_reported_at: Timestamp;
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

export type MachineProvidedRow = Selectable<MachineProvidedTable>;
export type NewMachineProvided = Insertable<MachineProvidedTable>;

/**
 * The processes the shepherd claims work under. `process` is free text in the
 * database, so other components add their own without a migration.
 */
export const Process = {
  ShepherdAccess: 'ShepherdAccess',
  ShepherdAgentStart: 'ShepherdAgentStart',
  ShepherdRecovery: 'ShepherdRecovery',
} as const;

/** Processes whose live work excludes a machine from every shepherd selection. */
export const SHEPHERD_PROCESSES: readonly string[] = [
  Process.ShepherdAccess,
  Process.ShepherdAgentStart,
  Process.ShepherdRecovery,
];
