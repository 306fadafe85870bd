/**
 * The BMaaS machine model on the BMDB control-loop core
 * (`@bmaas/bmdb-controlloop`): the tables of its tags (whose types it merges
 * into the core's `Database`), every query over them (one function each, of
 * a Kysely instance or transaction), the selections of the shepherd's loops,
 * agent heartbeats, enrollment, network boots, OS installations and disk
 * wipes, holds and the operator history, the fleet page's reads and the
 * fleet gauges.
 *
 * @packageDocumentation
 */

export type { AgentHeartbeat, OSInstallationReport } from './agent-heartbeat-check.js';
export { AGENT_LOG_MAX_BYTES } from './agent-heartbeat-check.js';
export { AgentHeartbeats } from './agent-heartbeats.js';
export { type EnrollmentRefusal, EnrollmentRefusedError } from './errors.js';
export {
  checkHostname,
  checkNetworkConfig,
  checkSshPublicKey,
  FirstBootSettingError,
  isHostname,
  type NetworkConfig,
} from './first-boot.js';
export { FleetMetrics, type FleetMetricsOptions, startFleetMetrics } from './fleet-metrics.js';
export { type AgentBootCounts, agentBootCounts, agentBootMethod, setAgentBootMethods } from './queries/agent-boot.js';
export {
  agentBootSelection,
  agentRecoverySelection,
  agentStartSelection,
  machinesForAgentBoot,
  machinesForAgentRecovery,
  machinesForAgentStart,
  needsAgentBoot,
  powerActionSelection,
} from './queries/agent-selections.js';
export {
  agentHeartbeatsAhead,
  deleteAgentHeartbeat,
  deleteAgentStarted,
  hardwareReport,
  osInstallationReport,
  setAgentHeartbeat,
  setAgentHeartbeats,
  setAgentStarted,
  startedAgents,
} from './queries/agent-tags.js';
export type { BackoffCause } from './queries/backoffs.js';
export { activeBackoffs, backoffCauses, workBackoffs } from './queries/backoffs.js';
export type { DecommissionReport, WipeDecommissionReport } from './queries/decommission.js';
export { decommissionMachines, decommissionWithWipe } from './queries/decommission.js';
export {
  type AgentEnrollmentState,
  agentEnrollment,
  ENROLLMENT_REFUSALS_RECORDED_EVERY_SECONDS,
  type EnrollmentOutcome,
  type EnrollmentRequest,
  type EnrollmentToken,
  enrollAgent,
  issueEnrollmentToken,
  renewEnrollmentToken,
  revokeEnrollmentToken,
} from './queries/enrollment.js';
export type { FirstBootCounts, FirstBootOutcome, FirstBootReport } from './queries/first-boot.js';
export { bootSecretSha256, firstBootCounts, recordFirstBoot } from './queries/first-boot.js';
export {
  backoffsByProcess,
  controlByLocation,
  fleetStages,
  fleetStagesByLocation,
  hardwareByLocation,
  newestAgentHeartbeatAge,
  sessionsByProcessor,
} from './queries/fleet-metrics.js';
export type { MachineDetail, MachineSummary } from './queries/fleet-page.js';
export { findMachine, machineDetail, machinePage } from './queries/fleet-page.js';
export {
  databaseNow,
  type FleetControl,
  type FleetStages,
  type FleetStats,
  fleetStats,
  type LiveSession,
  liveSessions,
  liveWorkByProcess,
  MACHINE_STAGES,
  type MachineStage,
  machinesPerProvider,
  providers,
} from './queries/fleet-stats.js';
export type { RecentFailure } from './queries/history.js';
export { recentFailures, workHistory } from './queries/history.js';
export type { HoldRequest, PlacedHold } from './queries/holds.js';
export { heldMachines, holdMachine, machineHold, unholdMachine } from './queries/holds.js';
export type { MachineFilter } from './queries/machine-filter.js';
export type { MachineLookup, MachineNames, MachineRef } from './queries/machine-lookup.js';
export { lookUpMachines } from './queries/machine-lookup.js';
export {
  armNetworkBoot,
  endNetworkBoot,
  liveNetworkBoot,
  liveNetworkBootsByMac,
  networkBootState,
  serveNetworkBootConfig,
} from './queries/network-boot.js';
export type { NewOperatorAction } from './queries/operator-history.js';
export { operatorHistory, recordOperatorAction } from './queries/operator-history.js';
export type {
  DiskWipeRequest,
  FirstBoot,
  OSImage,
  OSInstallation,
  OSInstallationCancel,
  OSInstallationCounts,
  OSInstallationRequest,
  PendingOSInstallation,
} from './queries/os-installation.js';
export {
  cancelOSInstallation,
  FIRST_BOOT_BOUND_MINUTES,
  osInstallation,
  osInstallationCounts,
  osInstallations,
  requestDiskWipe,
  requestOSInstallation,
} from './queries/os-installation.js';
export type { PowerReadLease, PowerReadResult } from './queries/power-state.js';
export {
  forgetPowerRead,
  leasePowerRead,
  leasePowerReads,
  powerState,
  recordPowerRead,
  recordPowerState,
} from './queries/power-state.js';
export type { NewProvided, ProvidedMachine, ProviderStatusUpdate } from './queries/provided-tags.js';
export {
  addProvided,
  newMachine,
  providedMachine,
  providedMachines,
  updateProviderStatus,
} from './queries/provided-tags.js';
export type { RecoveryThresholds } from './queries/recovery-thresholds.js';
export {
  forgetUnlistedRetiredMachines,
  NotRetiredError,
  type RetiredMachine,
  recommissionMachines,
  retiredMachine,
  retiredMachineCount,
  retiredMachines,
  retiredProviderIds,
} from './queries/retired-machines.js';
export { checkRootDeviceHints, RootDeviceHintError, type RootDeviceHints } from './root-device-hints.js';
export {
  type AgentBootMethod,
  type ModelTables,
  OperatorAction,
  OperatorOutcome,
  type OSImageCompression,
  OSInstallationResult,
  OSInstallationState,
  OSRequestKind,
  PowerState,
  Process,
  ProviderStatus,
  SHEPHERD_PROCESSES,
} from './schema.js';
