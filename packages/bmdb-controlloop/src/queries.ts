import type { Kysely } from 'kysely';
import type { HardwareReportEntry, OSInstallationReportEntry } from './agent-heartbeat-check.js';
import {
  agentRecoverySelection,
  agentStartSelection,
  machinesForAgentRecovery,
  machinesForAgentStart,
  powerActionSelection,
} from './queries/agent-selections.js';
import {
  agentHeartbeatsAhead,
  deleteAgentHeartbeat,
  deleteAgentStarted,
  type HeartbeatAhead,
  hardwareReport,
  osInstallationReport,
  type StartedAgent,
  setAgentHeartbeat,
  setAgentHeartbeats,
  setAgentStarted,
  startedAgents,
} from './queries/agent-tags.js';
import {
  type ActiveBackoff,
  activeBackoffs,
  type BackoffCause,
  backoffCauses,
  type WorkBackoffEntry,
  workBackoffs,
} from './queries/backoffs.js';
import {
  type DecommissionReport,
  decommissionMachines,
  decommissionWithWipe,
  type WipeDecommissionReport,
} from './queries/decommission.js';
import {
  backoffsByProcess,
  controlByLocation,
  fleetStages,
  fleetStagesByLocation,
  hardwareByLocation,
  type LocationControl,
  type LocationHardware,
  newestAgentHeartbeatAge,
  type ProcessorSessions,
  type StagesByLocation,
  sessionsByProcessor,
} from './queries/fleet-metrics.js';
import { findMachine, type MachineDetail, type MachinePage, machineDetail, machinePage } from './queries/fleet-page.js';
import {
  databaseNow,
  type FleetControl,
  type FleetStages,
  type FleetStats,
  fleetStats,
  type LiveSession,
  liveSessions,
  liveWorkByProcess,
  machinesPerProvider,
  providers,
} from './queries/fleet-stats.js';
import { type RecentFailure, recentFailures, type WorkHistoryEntry, workHistory } from './queries/history.js';
import {
  type HeldMachine,
  type HoldRequest,
  heldMachines,
  holdMachine,
  type MachineHold,
  machineHold,
  type PlacedHold,
  unholdMachine,
} from './queries/holds.js';
import type { MachineFilter } from './queries/machine-filter.js';
import { lookUpMachines, type MachineLookup, type MachineNames } from './queries/machine-lookup.js';
import {
  type NewOperatorAction,
  type OperatorHistoryEntry,
  operatorHistory,
  recordOperatorAction,
} from './queries/operator-history.js';
import {
  cancelOSInstallation,
  type DiskWipeRequest,
  type ListedOSInstallation,
  type OSInstallation,
  type OSInstallationCancel,
  type OSInstallationCounts,
  type OSInstallationRequest,
  osInstallation,
  osInstallationCounts,
  osInstallations,
  requestDiskWipe,
  requestOSInstallation,
} from './queries/os-installation.js';
import {
  forgetPowerRead,
  leasePowerRead,
  leasePowerReads,
  type PowerReadLease,
  type PowerReadResult,
  type PowerStateRecord,
  powerState,
  recordPowerRead,
  recordPowerState,
} from './queries/power-state.js';
import {
  addProvided,
  type NewProvided,
  newMachine,
  type ProvidedMachine,
  type ProviderStatusUpdate,
  providedMachine,
  providedMachines,
  updateProviderStatus,
} from './queries/provided-tags.js';
import type { RecoveryThresholds } from './queries/recovery-thresholds.js';
import type { Database, MachineProvidedRow, OSInstallationState } from './schema.js';
import type { Selection } from './selection.js';

/**
 * Typed queries over the machine model, bound to one transaction. Passed to
 * every `Session.transact` callback; `db` is the transaction itself for
 * queries of your own.
 */
export class Queries {
  constructor(
    /** The Kysely transaction these queries run in. */
    readonly db: Kysely<Database>,
  ) {}

  /** Creates a machine and returns its ID. */
  async newMachine(): Promise<string> {
    return newMachine(this.db);
  }

  /** Adds the Provided tag: the machine is now known to `provider` as `providerId`. */
  async addProvided(machineId: string, tag: NewProvided): Promise<void> {
    return addProvided(this.db, machineId, tag);
  }

  /**
   * Updates the provider-side facts of the machine `providerId` of `provider`.
   *
   * @returns whether such a machine exists
   */
  async updateProviderStatus(provider: string, providerId: string, update: ProviderStatusUpdate): Promise<boolean> {
    return updateProviderStatus(this.db, provider, providerId, update);
  }

  /** Sets (or replaces) the AgentStarted tag. `startedAt` defaults to the database's now. */
  async setAgentStarted(machineId: string, agent: { publicKey: Uint8Array; startedAt?: Date }): Promise<void> {
    return setAgentStarted(this.db, machineId, agent);
  }

  /** Removes the AgentStarted tag, if any. */
  async deleteAgentStarted(machineId: string): Promise<void> {
    return deleteAgentStarted(this.db, machineId);
  }

  /** Records an agent heartbeat at `at` (default, and at most, the database's now). */
  async setAgentHeartbeat(machineId: string, at?: Date): Promise<void> {
    return setAgentHeartbeat(this.db, machineId, at);
  }

  /** Removes the AgentHeartbeat tag, if any. */
  async deleteAgentHeartbeat(machineId: string): Promise<void> {
    return deleteAgentHeartbeat(this.db, machineId);
  }

  /**
   * Records a heartbeat at the database's now for each of `machineIds`, a
   * few statements for any number (two parameters a machine, well under
   * PostgreSQL's 65535 per statement).
   */
  async setAgentHeartbeats(machineIds: readonly string[]): Promise<void> {
    return setAgentHeartbeats(this.db, machineIds);
  }

  /** The machines of `provider` whose agent was started (AgentStarted), and when. */
  async startedAgents(provider: string): Promise<StartedAgent[]> {
    return startedAgents(this.db, provider);
  }

  /**
   * The heartbeats of `provider`'s machines dated more than `toleranceSeconds`
   * after the database's now, and that now: an index range scan
   * (`machine_agent_heartbeat_at_idx`).
   */
  async agentHeartbeatsAhead(options: {
    provider: string;
    toleranceSeconds: number;
  }): Promise<{ now: Date; heartbeats: HeartbeatAhead[] }> {
    return agentHeartbeatsAhead(this.db, options);
  }

  /** The machine's last hardware report from its agent, if any. */
  async hardwareReport(machineId: string): Promise<HardwareReportEntry | undefined> {
    return hardwareReport(this.db, machineId);
  }

  /** The machine's last OS installation report from its agent, if any. */
  async osInstallationReport(machineId: string): Promise<OSInstallationReportEntry | undefined> {
    return osInstallationReport(this.db, machineId);
  }

  /** Every machine provided by `provider`, ordered by provider ID. */
  async providedMachines(provider: string): Promise<ProvidedMachine[]> {
    return providedMachines(this.db, provider);
  }

  /** The Provided tag of one machine, if it has one. */
  async providedMachine(machineId: string): Promise<ProvidedMachine | undefined> {
    return providedMachine(this.db, machineId);
  }

  /**
   * Machines of `provider` whose agent must be started: provided, no
   * AgentStarted tag, no live shepherd work, no running ShepherdAgentStart
   * backoff, not held.
   */
  async machinesForAgentStart(options: { provider: string; limit: number }): Promise<ProvidedMachine[]> {
    return machinesForAgentStart(this.db, options);
  }

  /**
   * {@link Queries.machinesForAgentStart} as a {@link Selection}, for
   * one-statement claims (`Session.work`, `ControlLoop.selectMachines`).
   */
  agentStartSelection(options: { provider: string }): Selection<ProvidedMachine, MachineProvidedRow> {
    return agentStartSelection(this.db, options);
  }

  /**
   * Machines of `provider` whose agent went silent: AgentStarted and either no
   * heartbeat `firstHeartbeatWithin` after the start, or a last heartbeat older
   * than `heartbeatWithin`; no live shepherd work, no running
   * ShepherdRecovery backoff, not held.
   */
  async machinesForAgentRecovery(
    options: { provider: string; limit: number } & RecoveryThresholds,
  ): Promise<ProvidedMachine[]> {
    return machinesForAgentRecovery(this.db, options);
  }

  /**
   * The machine `machineId` as a {@link Selection} for an operator's power
   * action (process `ShepherdPowerAction`): offered unless work of any
   * shepherd process is live on it, so a power action and a recovery of
   * one machine never run together. Held machines are offered: holds are
   * for working on machines.
   */
  powerActionSelection(machineId: string): Selection<ProvidedMachine, MachineProvidedRow> {
    return powerActionSelection(this.db, machineId);
  }

  /** {@link Queries.machinesForAgentRecovery} as a {@link Selection}. */
  agentRecoverySelection(
    options: { provider: string } & RecoveryThresholds,
  ): Selection<ProvidedMachine, MachineProvidedRow> {
    return agentRecoverySelection(this.db, options);
  }

  /**
   * Removes the machines `providerIds` of `provider` from the BMDB: the
   * machine rows and, by cascade, their tags and backoffs. Machines with
   * work held by a live session (any process) are refused and left as they
   * are; work left behind by expired sessions goes with its machine. Work
   * history has no key on machines and stays, for the record.
   *
   * The machines are locked first (`FOR UPDATE`), so a claim racing with the
   * removal either lands first and is seen, or waits and then fails.
   */
  async decommissionMachines(provider: string, providerIds: readonly string[]): Promise<DecommissionReport> {
    return decommissionMachines(this.db, provider, providerIds);
  }

  /**
   * Decommissions the machines `providerIds` of `provider` once their disks
   * were wiped: a machine whose decommission wipe succeeded is removed (as
   * {@link Queries.decommissionMachines}); one with a running agent (an
   * AgentStarted tag) and no wipe under way gets one requested
   * ({@link Queries.requestDiskWipe} with `decommission`), and is removed by
   * a later call once its agent reported success; one whose wipe failed is
   * kept, with the agent's error (requested again with `retryFailed`); one
   * with no agent is kept: nothing can wipe its disks. Run it in a
   * transaction (`Session.transact`): the machines are locked first.
   */
  async decommissionWithWipe(
    provider: string,
    providerIds: readonly string[],
    request: { readonly actor: string; readonly reason: string; readonly retryFailed: boolean },
  ): Promise<WipeDecommissionReport> {
    return decommissionWithWipe(this.db, provider, providerIds, request);
  }

  /**
   * The machines a person names, by provider and provider IDs or by machine
   * IDs, with the work running on each; and the names the BMDB does not
   * know (a machine ID that is no UUID among them).
   */
  async lookUpMachines(names: MachineNames): Promise<MachineLookup> {
    return lookUpMachines(this.db, names);
  }

  /**
   * Holds the machine: from now on no selection the library builds offers
   * it (unless it opts in, as power actions do), so no loop claims it: no
   * claim committed after the hold is on the machine, however close they
   * came. Work already running on it ends on its own, and is named
   * (`liveWork`: every claim committed before the hold), as is an OS
   * installation under way (`installing`). Records `Hold` in the operator
   * history. A machine already held keeps its hold (reason, actor, since):
   * `placed` is false and nothing is recorded.
   *
   * It runs in this `Queries`' transaction, or in one of its own, and waits
   * for the claims in flight on the machine to commit. At REPEATABLE READ or
   * SERIALIZABLE (as in `Session.transact`), a claim committed since the
   * transaction began fails it with a serialization error, which
   * `Session.transact` retries.
   *
   * @throws {@link BMDBError} without a reason or an actor, or for a machine not in the BMDB
   */
  async holdMachine(machineId: string, request: HoldRequest): Promise<PlacedHold> {
    return holdMachine(this.db, machineId, request);
  }

  /**
   * Releases the machine's hold, recording `Unhold` in the operator history;
   * the loops' idle workers are woken. Returns the hold released, or
   * `undefined` when the machine was not held (nothing is recorded).
   */
  async unholdMachine(
    machineId: string,
    request: { readonly actor: string; readonly reason?: string | undefined },
  ): Promise<MachineHold | undefined> {
    return unholdMachine(this.db, machineId, request);
  }

  /** The machine's hold, if it is held. */
  async machineHold(machineId: string): Promise<MachineHold | undefined> {
    return machineHold(this.db, machineId);
  }

  /** Held machines, longest held first (default at most 100), with provider ID and age. */
  async heldMachines(options: { limit?: number } = {}): Promise<HeldMachine[]> {
    return heldMachines(this.db, options);
  }

  /**
   * Records what a person did to a machine in its operator history: the
   * shepherd's holds and power actions, or a component's own action (an OS
   * installation requested, cancelled), with outcome, reason, actor, cause
   * and particulars (`detail`, JSON).
   *
   * @throws {@link BMDBError} without an action, actor or a known outcome
   */
  async recordOperatorAction(entry: NewOperatorAction): Promise<void> {
    return recordOperatorAction(this.db, entry);
  }

  /** A machine's operator history, oldest first (newest first and at most `limit` if asked). */
  async operatorHistory(
    machineId: string,
    options: { newestFirst?: boolean; limit?: number } = {},
  ): Promise<OperatorHistoryEntry[]> {
    return operatorHistory(this.db, machineId, options);
  }

  /**
   * Requests an OS installation of the machine: the disk image is handed to
   * its agent with its next heartbeat's answer (the initializer starts an
   * agent where none runs, an installed machine included). Each request
   * gets the next generation, past every one requested or reported before,
   * and replaces the machine's request whatever its state (an installation
   * under way is told by its next heartbeat's answer). Records `InstallOS`
   * in the operator history with who, why and the image.
   *
   * @throws {@link BMDBError} for a machine not in the BMDB, without an actor
   *   or a reason, or for an image no agent could install (naming the field)
   */
  async requestOSInstallation(machineId: string, request: OSInstallationRequest): Promise<OSInstallation> {
    return requestOSInstallation(this.db, machineId, request);
  }

  /**
   * Requests a wipe of every disk of the machine: a request of kind
   * `DiskWipe`, handed to its agent and reported as an installation is (the
   * next generation, replacing its current request), which discards each
   * disk where it can and zeroes its first and last MiB. Records `WipeDisks`
   * in the operator history. After its `Success` the agent stops (it does
   * not reboot) and the machine counts as its installation's `Succeeded`.
   *
   * @throws {@link BMDBError} for a machine not in the BMDB, or without an actor or a reason
   */
  async requestDiskWipe(machineId: string, request: DiskWipeRequest): Promise<OSInstallation> {
    return requestDiskWipe(this.db, machineId, request);
  }

  /**
   * Withdraws the machine's OS installation request (`Requested`,
   * `Delivered` or `Failed`): it is handed out no more, a report of it is
   * ignored, and the agent installing it learns so from its next
   * heartbeat's answer. A request that succeeded is not canceled (request
   * a new one). Records `CancelOSInstallation` in the operator history,
   * `Refused` with the cause when there was nothing to cancel.
   */
  async cancelOSInstallation(
    machineId: string,
    request: { readonly actor: string; readonly reason: string },
  ): Promise<OSInstallationCancel> {
    return cancelOSInstallation(this.db, machineId, request);
  }

  /** The machine's current OS installation request and where it stands, if one was ever made. */
  async osInstallation(machineId: string): Promise<OSInstallation | undefined> {
    return osInstallation(this.db, machineId);
  }

  /** OS installation requests (of these states), most recently requested first, at most `limit` (default 100). */
  async osInstallations(
    options: { states?: readonly OSInstallationState[]; limit?: number } = {},
  ): Promise<ListedOSInstallation[]> {
    return osInstallations(this.db, options);
  }

  /** Machines per OS installation state (an index-only count). */
  async osInstallationCounts(): Promise<OSInstallationCounts> {
    return osInstallationCounts(this.db);
  }

  /** The machine's power state as last read, with the last read's failure; `undefined` for an unprovided machine. */
  async powerState(machineId: string): Promise<PowerStateRecord | undefined> {
    return powerState(this.db, machineId);
  }

  /**
   * Takes up to `limit` machines of `provider` for a power state read: the
   * never read first, then those taken up longest ago, at least
   * `intervalSeconds` ago. Concurrent callers get different machines. Index
   * range scans (`machine_power_state_due_idx`).
   */
  async leasePowerReads(options: {
    provider: string;
    limit: number;
    intervalSeconds: number;
  }): Promise<PowerReadLease[]> {
    return leasePowerReads(this.db, options);
  }

  /**
   * Takes up the machine for a read now, due or not, as `shepherd power
   * status` does before it asks the BMC: a read under way that began before
   * no longer counts, and this one does not once a power action or another
   * read came after it ({@link Queries.recordPowerRead} refuses it).
   * `undefined` for an unprovided machine.
   */
  async leasePowerRead(machineId: string): Promise<PowerReadLease | undefined> {
    return leasePowerRead(this.db, machineId);
  }

  /**
   * Records a leased read's state (with the time read) or failure (with its
   * cause; the last state read stays), and returns the record it replaced.
   * Returns `undefined`, recording nothing, when the machine was taken up
   * again since: a power action since the read began asked for a fresh one,
   * or another read began after it. A read never overwrites a state
   * recorded after it began.
   */
  async recordPowerRead(
    lease: Pick<PowerReadLease, 'machineId' | 'token'>,
    result: PowerReadResult,
  ): Promise<PowerStateRecord | undefined> {
    return recordPowerRead(this.db, lease, result);
  }

  /**
   * Records a state known as of now, with nothing read for it that took
   * time (a fixture, a provider that pushes states); a read that takes time
   * leases first ({@link Queries.leasePowerRead}). False for an unprovided
   * machine.
   */
  async recordPowerState(machineId: string, result: PowerReadResult): Promise<boolean> {
    return recordPowerState(this.db, machineId, result);
  }

  /** Makes the machine the power sync's next read, and a read under way not count: after a power action. */
  async forgetPowerRead(machineId: string): Promise<void> {
    return forgetPowerRead(this.db, machineId);
  }

  /** A machine's work history, oldest first. */
  async workHistory(machineId: string, options: { process?: string } = {}): Promise<WorkHistoryEntry[]> {
    return workHistory(this.db, machineId, options);
  }

  /** A machine's backoffs (running or not), by process. */
  async workBackoffs(machineId: string): Promise<WorkBackoffEntry[]> {
    return workBackoffs(this.db, machineId);
  }

  /**
   * Running backoffs across the fleet, soonest to end first, with each
   * machine's provider ID and the seconds left.
   */
  async activeBackoffs(options: { process?: string; limit?: number } = {}): Promise<ActiveBackoff[]> {
    return activeBackoffs(this.db, options);
  }

  /**
   * Machines per lifecycle stage, live work and running backoffs per process.
   * A full scan: meant for status pages, not for control loops.
   */
  async fleetStats(options: { provider?: string } & RecoveryThresholds = {}): Promise<FleetStats> {
    return fleetStats(this.db, options);
  }

  /** The database's clock: what ages and "time left" on status pages are measured from. */
  async now(): Promise<Date> {
    return databaseNow(this.db);
  }

  /**
   * Machines per lifecycle stage, like {@link Queries.fleetStats}' `stages`,
   * without a scan joining every machine's tags: the sums over every place
   * of {@link Queries.fleetStagesByLocation} and
   * {@link Queries.controlByLocation} (per-place totals and the small sets),
   * fast enough for a page refreshed every few seconds at 100,000 machines.
   * A machine without a Provided tag counts as `unprovided` whatever its
   * other tags. Also the held machines and the provided machines per power
   * state.
   */
  async fleetStages(
    thresholds: RecoveryThresholds = {},
  ): Promise<{ machines: number; stages: FleetStages } & FleetControl> {
    return fleetStages(this.db, thresholds);
  }

  /**
   * The providers machines are provided by, sorted. One index probe per
   * provider (a loose index scan), not a scan of every machine.
   */
  async providers(): Promise<string[]> {
    return providers(this.db);
  }

  /** How many machines each provider has in the BMDB, by provider name. */
  async machinesPerProvider(): Promise<Record<string, number>> {
    return machinesPerProvider(this.db);
  }

  /** Live work items (held by unexpired sessions), per process. */
  async liveWorkByProcess(): Promise<Record<string, number>> {
    return liveWorkByProcess(this.db);
  }

  /** Sessions whose deadline has not passed (which processes are alive), oldest first, with their live work. */
  async liveSessions(): Promise<LiveSession[]> {
    return liveSessions(this.db);
  }

  /**
   * Machines per lifecycle stage for each provider and location (the stages
   * of {@link Queries.fleetStages}, split by where the machines are): one
   * index-only count of the provided machines and key lookups for the few
   * pending, starting, silent and stale ones, at any fleet size.
   */
  async fleetStagesByLocation(thresholds: RecoveryThresholds = {}): Promise<StagesByLocation> {
    return fleetStagesByLocation(this.db, thresholds);
  }

  /**
   * Hardware totals (machines, CPU threads, memory, disks and their capacity)
   * per provider and location, from each machine's last hardware report, as
   * read by the database when it was stored (migration 0008).
   */
  async hardwareByLocation(): Promise<LocationHardware[]> {
    return hardwareByLocation(this.db);
  }

  /**
   * Machines held, per power state and whose power read failed, per provider
   * and location (the counts `fleetStages` gives for the fleet, split by
   * where the machines are), from per-place totals kept by triggers.
   */
  async controlByLocation(): Promise<LocationControl[]> {
    return controlByLocation(this.db);
  }

  /** Running backoffs (machines backing off) per process; every shepherd process is present, 0 when none. */
  async backoffsByProcess(): Promise<Record<string, number>> {
    return backoffsByProcess(this.db);
  }

  /** Live sessions per component and processor: which processes are alive, and how many of each. */
  async sessionsByProcessor(): Promise<ProcessorSessions[]> {
    return sessionsByProcessor(this.db);
  }

  /** Seconds since the newest agent heartbeat, by the database's clock; undefined when there is none. */
  async newestAgentHeartbeatAge(): Promise<number | undefined> {
    return newestAgentHeartbeatAge(this.db);
  }

  /**
   * Running backoffs grouped by process and cause, the most machines first:
   * how many machines fail for the same reason. Causes often name their
   * machine; UUIDs and IPv4 addresses (with a port) in them are replaced by
   * `<id>` and `<address>` first, so one failure on many machines is one
   * group.
   */
  async backoffCauses(options: { limit?: number } = {}): Promise<BackoffCause[]> {
    return backoffCauses(this.db, options);
  }

  /** The fleet's latest `Failed` history events, newest first (index `work_history_failed_idx`). */
  async recentFailures(options: { limit?: number } = {}): Promise<RecentFailure[]> {
    return recentFailures(this.db, options);
  }

  /**
   * The machine a person means by `id`: a machine ID, or a provider ID known
   * to exactly one provider. `undefined` when none or several match.
   */
  async findMachine(id: string): Promise<string | undefined> {
    return findMachine(this.db, id);
  }

  /**
   * One page of machines matching `filter`, in machine ID order, from
   * `filter.after` (keyset pagination: pass the page's `next` to get the
   * next). Each filter is served by an index: the most selective one given
   * chooses the rows read, the others are checked on them.
   */
  async machinePage(filter: MachineFilter = {}, thresholds: RecoveryThresholds = {}): Promise<MachinePage> {
    return machinePage(this.db, filter, thresholds);
  }

  /**
   * Everything known about one machine: its tags and stage, live work, every
   * backoff (running or expired) and its work history, newest first, up to
   * `historyLimit` entries (default 500; `historyTotal` says how many exist).
   */
  async machineDetail(
    machineId: string,
    options: { historyLimit?: number } & RecoveryThresholds = {},
  ): Promise<MachineDetail | undefined> {
    return machineDetail(this.db, machineId, options);
  }
}
