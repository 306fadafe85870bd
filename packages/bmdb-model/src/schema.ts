import type { Database as CoreDatabase, Timestamp } from '@bmaas/bmdb-controlloop/extend';
import type { ColumnType, Generated, Insertable, Selectable } from 'kysely';
import type { NetworkConfig } from './first-boot.js';
import type { RootDeviceHints } from './root-device-hints.js';

/**
 * The machine model's tables as Kysely sees them: the BMaaS tags, the
 * fleet's totals, the operator history and the retired machines. They are
 * merged into the core's `Database` (below), so `bmdb.db` and every
 * transaction the core hands out know them once this package is imported.
 * Column names are the database's own (snake_case).
 */
export interface ModelTables {
  machine_provided: MachineProvidedTable;
  machine_agent_started: MachineAgentStartedTable;
  machine_agent_heartbeat: MachineAgentHeartbeatTable;
  machine_agent_pending: MachineAgentPendingTable;
  machine_agent_boot: MachineAgentBootTable;
  machine_hardware_report: MachineHardwareReportTable;
  machine_agent_log: MachineAgentLogTable;
  machine_agent_enrollment: MachineAgentEnrollmentTable;
  machine_network_boot: MachineNetworkBootTable;
  machine_os_installation_report: MachineOsInstallationReportTable;
  machine_os_installation_request: MachineOsInstallationRequestTable;
  machine_unprovided: MachineUnprovidedTable;
  fleet_location_totals: FleetLocationTotalsTable;
  machine_power_state: MachinePowerStateTable;
  operator_history: OperatorHistoryTable;
  machine_retired: MachineRetiredTable;
}

declare module '@bmaas/bmdb-controlloop' {
  /** The core's tables and the machine model's: what `bmdb.db` knows once the model is imported. */
  interface Database extends ModelTables {}
}

/** Every table of the BMDB: the core's and the machine model's. */
export type Database = CoreDatabase & ModelTables;

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
  /** Whether the machine's BMC boots its agent (migration 0015, from `machine_agent_boot`); kept by triggers. */
  agent_boot: Generated<boolean>;
}

/**
 * How a machine's agent arrives:
 * - `ssh`: the initializer takes the running OS over through SSH (a takeover); the default.
 * - `virtual-media`: the machine's BMC boots the agent's ISO from virtual media (Redfish `InsertMedia`).
 * - `network`: the machine's BMC boots it from the network once (PXE, then iPXE fetching its script).
 */
export type AgentBootMethod = 'ssh' | 'virtual-media' | 'network';

/**
 * A machine whose BMC boots its agent (migration 0015), and how; a machine
 * without a row is taken over through SSH. Written by `setAgentBootMethods`.
 */
export interface MachineAgentBootTable {
  machine_id: string;
  boot_method: Exclude<AgentBootMethod, 'ssh'>;
}

/** Machines without a Provided tag (migration 0004). Kept by triggers; never written by hand. */
export interface MachineUnprovidedTable {
  machine_id: string;
}

/**
 * Per provider and location (`''` for none), spread over 64 rows (`shard`):
 * provided machines, the sums of their hardware reports' totals, the machines
 * held, per power state and whose power read failed (migration 0008), the
 * installed ones (0009). Kept
 * by triggers; never written by hand. Sum a place's rows to read it.
 * Numerics and bigints are read as strings.
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
  held: string;
  power_on: string;
  power_off: string;
  powering_on: string;
  powering_off: string;
  power_unknown: string;
  power_unread: string;
  power_read_failed: string;
  installed: string;
}

export interface MachineAgentStartedTable {
  machine_id: string;
  agent_started_at: Timestamp;
  agent_public_key: Uint8Array;
  /** Whether an AgentHeartbeat row exists; kept by triggers, for the recovery index. Never write it. */
  has_heartbeat: Generated<boolean>;
  /** Whether the machine's BMC boots its agent (migration 0018, from `machine_agent_boot`); kept by triggers. Never write it. */
  agent_boot: Generated<boolean>;
}

export interface MachineAgentHeartbeatTable {
  machine_id: string;
  agent_heartbeat_at: Timestamp;
  /** Whether the machine's BMC boots its agent (migration 0018, from `machine_agent_boot`); kept by triggers. Never write it. */
  agent_boot: Generated<boolean>;
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
   * `AgentHeartbeats.record` as it stores it; null when it could not be
   * read. Bigints are read as strings.
   */
  cpu_threads: Generated<string | null>;
  memory_bytes: Generated<string | null>;
  disks: Generated<number | null>;
  disk_bytes: Generated<string | null>;
}

/** The tail of the agent's log its last heartbeat carrying one sent (migration 0013): at most 64 KiB of UTF-8. */
export interface MachineAgentLogTable {
  machine_id: string;
  agent_log: string;
  agent_log_received_at: Timestamp;
}

/**
 * A machine's one-time enrollment token (migration 0014): its sha256 only,
 * when it was issued, until when it is good and when it was used.
 */
export interface MachineAgentEnrollmentTable {
  machine_id: string;
  token_sha256: Uint8Array;
  issued_at: Timestamp;
  expires_at: Timestamp;
  enrolled_at: Timestamp | null;
  /** The boot it was issued for (migration 0016); null for a token issued without one. */
  boot_id: Generated<string | null>;
}

/**
 * A machine's last network boot (migration 0016): what any shepherd process's
 * boot files need to answer its iPXE script and serve its config once.
 */
export interface MachineNetworkBootTable {
  machine_id: string;
  boot_id: string;
  /** The session of the agent booter's claim the boot was armed under: the boot is live while it holds the claim. */
  session_id: string;
  /** The path part of the boot's script and config URLs (43 characters, base64url). */
  capability: string;
  /** Lower case, colons. */
  macs: string[];
  /** A serialized `cloud.agent.api.TakeoverInit`. */
  takeover_init: Uint8Array;
  agent_flags: string[];
  token_valid_seconds: number;
  armed_at: Timestamp;
  ended_at: Timestamp | null;
  config_served_at: Timestamp | null;
  config_served_to: string | null;
  config_refused_at: Timestamp | null;
  config_refused_to: string | null;
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
  /**
   * The key of the agent that sent it (migration 0010), against which a
   * repeat of a `Success` report is checked once the AgentStarted tag went;
   * null for reports stored before.
   */
  agent_public_key: Generated<Uint8Array | null>;
}

/** Where a machine's OS installation request stands (migration 0009). */
export const OSInstallationState = {
  /** Requested, not yet handed to an agent. */
  Requested: 'Requested',
  /** Handed to the machine's agent in a heartbeat's answer; no report of it yet. */
  Delivered: 'Delivered',
  /** The agent reported success: the machine is installed and runs its OS. */
  Succeeded: 'Succeeded',
  /** The agent reported an error (kept with the request); an operator requests again. */
  Failed: 'Failed',
  /** Withdrawn by an operator before it succeeded. */
  Canceled: 'Canceled',
} as const;
export type OSInstallationState = (typeof OSInstallationState)[keyof typeof OSInstallationState];

/** How the image is compressed as downloaded: `none` lets the agent go by its first bytes (raw, gzip, xz, zstd, qcow2). */
export type OSImageCompression = 'none' | 'gzip';

/** What an OS installation request asks of the agent: write a disk image, or wipe every disk's metadata. */
export const OSRequestKind = { DiskImage: 'DiskImage', DiskWipe: 'DiskWipe' } as const;
export type OSRequestKind = (typeof OSRequestKind)[keyof typeof OSRequestKind];

/**
 * A machine's current OS installation request (migration 0009): the disk
 * image to write, its generation, and where it stands. Who requested or
 * canceled it and why is in `operator_history`.
 */
export interface MachineOsInstallationRequestTable {
  machine_id: string;
  /** A bigint, read as a string. */
  generation: ColumnType<string, string | bigint, string | bigint>;
  /** What is asked (migration 0012): a disk image written, or every disk wiped. */
  request_kind: ColumnType<OSRequestKind, OSRequestKind | undefined, OSRequestKind>;
  /** A wipe `shepherd decommission --wipe` requested: the machine is removed once it succeeded (migration 0012). */
  decommission: ColumnType<boolean, boolean | undefined, boolean>;
  /** Null for a disk wipe. */
  image_url: string | null;
  /** sha256 of the image's bytes as downloaded, 64 lower-case hex digits; null for a disk wipe. */
  image_sha256: string | null;
  /** Null when the request names its disk by hints alone (migration 0011). */
  root_device: string | null;
  /** Metal3 root-device hints, if any (migration 0011). */
  root_device_hints: ColumnType<RootDeviceHints | null, string | null, string | null>;
  compression: OSImageCompression;
  /** cloud-init user-data, if any. */
  user_data: Uint8Array | null;
  requested_at: Generated<Date>;
  requested_by: string;
  installation_state: ColumnType<OSInstallationState, OSInstallationState | undefined, OSInstallationState>;
  delivered_at: Timestamp | null;
  installation_ended_at: Timestamp | null;
  installation_error: string | null;
  /** The installed OS's hostname (migration 0019); null for a disk wipe. */
  hostname: string | null;
  /** OpenSSH public keys for the installed OS (migration 0019). */
  ssh_public_keys: ColumnType<string[], string[] | undefined, string[]>;
  /** The installed OS's network, the agent's model as JSON (migration 0019); null: DHCP on each NIC. */
  network: ColumnType<NetworkConfig | null, string | null, string | null>;
  /** sha256 of the first-boot secret the agent put on the config drive, from its `Success` report (migration 0019). */
  boot_secret_sha256: Uint8Array | null;
  /** When the installed OS reported its first boot (migration 0019). */
  booted_at: Timestamp | null;
  /** The SSH host keys the installed OS sent with its first boot (migration 0019). */
  booted_host_keys: string[] | null;
  /** Its machine's provider and location, for `fleet_location_totals`; kept by triggers, never write them. */
  provider: Generated<string | null>;
  provider_location: Generated<string | null>;
}
/** A machine's power state as its BMC or provider reports it. */
export const PowerState = {
  On: 'On',
  Off: 'Off',
  PoweringOn: 'PoweringOn',
  PoweringOff: 'PoweringOff',
  /** The BMC answered but did not say (a Redfish system without `PowerState`). */
  Unknown: 'Unknown',
} as const;
export type PowerState = (typeof PowerState)[keyof typeof PowerState];

/**
 * The last power state read of a machine (migration 0006). A row per
 * provided machine, made by a trigger when it is provided; `provider` is
 * kept in step by the same trigger, for the power sync's index.
 */
export interface MachinePowerStateTable {
  machine_id: string;
  provider: string;
  /** Null until a read succeeded. */
  power_state: PowerState | null;
  /** When `power_state` was read. */
  power_state_read_at: Timestamp | null;
  /** The last read that failed, and why; cleared by a read that succeeds. */
  power_read_failed_at: Timestamp | null;
  power_read_failed_cause: string | null;
  /** When a power sync last took the machine up for a read: its order and lease. Null: read it first. */
  power_checked_at: Timestamp | null;
  /** Its machine's location (migration 0008), for `fleet_location_totals`; kept by triggers, never write it. */
  provider_location: Generated<string | null>;
}

/** How an operator's action on a machine ended. */
export const OperatorOutcome = {
  Succeeded: 'Succeeded',
  Failed: 'Failed',
  /** Not tried: the machine was busy (live work of another process) or the action made no sense. */
  Refused: 'Refused',
} as const;
export type OperatorOutcome = (typeof OperatorOutcome)[keyof typeof OperatorOutcome];

/** The actions the shepherd records in the operator history; `action` is free text, so components add their own. */
export const OperatorAction = {
  Hold: 'Hold',
  Unhold: 'Unhold',
  PowerOn: 'PowerOn',
  PowerOff: 'PowerOff',
  PowerCycle: 'PowerCycle',
  /** An OS installation requested (`shepherd install`): `detail` has the generation and image. */
  InstallOS: 'InstallOS',
  /** An OS installation request withdrawn (`shepherd install --cancel`). */
  CancelOSInstallation: 'CancelOSInstallation',
  /** A disk wipe requested (`shepherd decommission --wipe`): `detail` has the generation. */
  WipeDisks: 'WipeDisks',
  /**
   * A BMC-booted agent's enrollment (`enrollAgent`), `Succeeded` (`detail` has the agent's key) or
   * `Refused` (`detail` has the reason); the actor is the agent, `bmaas-agent`.
   */
  EnrollAgent: 'EnrollAgent',
  /**
   * A network boot's config served (`Succeeded`, `detail` has who fetched it) or refused (`Refused`:
   * fetched again, or after its boot ended; `detail` has who and why); the actor is the fetcher's address.
   */
  ServeBootConfig: 'ServeBootConfig',
} as const;

/**
 * What people did to machines (migration 0006): holds, power actions, and
 * whatever other components record (an OS installation request, its
 * cancellation). Like `work_history`, no key on machines: it outlives them.
 */
export interface OperatorHistoryTable {
  machine_id: string;
  action: string;
  outcome: OperatorOutcome;
  reason: string | null;
  actor: string;
  timestamp: Generated<Date>;
  /** Why it failed or was refused. */
  cause: string | null;
  /** The action's particulars (`{"graceful": true}`, what the BMC was told), as JSON. */
  detail: ColumnType<unknown | null, string | null | undefined, string | null>;
}

/**
 * A machine decommissioned, by provider and provider ID (migration 0018):
 * its machine row is gone, and the provisioner does not bring it back from
 * its provider's inventory until the entry leaves the inventory or an
 * operator recommissions it.
 */
export interface MachineRetiredTable {
  provider: string;
  provider_id: string;
  /** The machine ID it had, which its work and operator history keep. */
  machine_id: string;
  retired_at: Generated<Date>;
  /** Who decommissioned it; null when not said. */
  retired_by: string | null;
  retire_reason: string | null;
  /** Whether its disks were wiped before (`decommission --wipe`). */
  wiped: boolean;
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
  /** An operator's power action on one machine (`shepherd power on|off|cycle`). */
  ShepherdPowerAction: 'ShepherdPowerAction',
  /** Booting a machine's agent through its BMC (virtual media or network), for machines whose boot method is not SSH. */
  ShepherdAgentBoot: 'ShepherdAgentBoot',
} as const;

/**
 * The processes that bring a machine's agent up, by an SSH takeover or an
 * agent boot: a machine under live work of either is in stage `agentStarting`.
 */
export const AGENT_STARTING_PROCESSES: readonly string[] = [Process.ShepherdAgentStart, Process.ShepherdAgentBoot];

/** Processes whose live work excludes a machine from every shepherd selection. */
export const SHEPHERD_PROCESSES: readonly string[] = [
  Process.ShepherdAccess,
  Process.ShepherdAgentStart,
  Process.ShepherdRecovery,
  Process.ShepherdPowerAction,
  Process.ShepherdAgentBoot,
];
