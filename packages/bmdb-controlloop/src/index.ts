/**
 * The BMDB control-loop library: a PostgreSQL machine database with sessions,
 * exclusive work claims, backoff, typed machine-model queries and a runner
 * for control loops over it.
 *
 * @packageDocumentation
 */

export type { AgentHeartbeat, OSInstallationReport } from './agent-heartbeat-check.js';
export { AGENT_LOG_MAX_BYTES } from './agent-heartbeat-check.js';
export type { Backoff } from './backoff.js';
export { BMDB, type BMDBOptions, type ConnectionOptions, type IsolationLevel } from './connection.js';
export { type ControlLoop, type ControlLoopOptions, runControlLoop, type Task } from './control-loop.js';
export { parseDuration } from './duration.js';
export type { EmbeddedDatabaseOptions } from './embedded.js';
export {
  BMDBError,
  ConnectionClosedError,
  DatabaseUnreachableError,
  EmbeddedDatabaseError,
  type EnrollmentRefusal,
  EnrollmentRefusedError,
  InvalidSettingError,
  NothingToDoError,
  ProcessMismatchError,
  SessionClosedError,
  SessionExpiredError,
  WorkConflictError,
  WorkEndedError,
  type WorkEndState,
  WorkLostError,
  type WorkOutcome,
} from './errors.js';
export {
  checkHostname,
  checkNetworkConfig,
  checkSshPublicKey,
  FirstBootSettingError,
  isHostname,
  type NetworkConfig,
} from './first-boot.js';
export { FleetMetrics, type FleetMetricsOptions } from './fleet-metrics.js';
export { parseLimiter, RateLimiter } from './limiter.js';
export type { ComponentSchema } from './migrations/index.js';
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
export { hasLiveWork, inBackoff, isHeld } from './queries/conditions.js';
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
export { redactUrl } from './redact-url.js';
export { checkRootDeviceHints, RootDeviceHintError, type RootDeviceHints } from './root-device-hints.js';
export { type RoundsOptions, runRounds } from './rounds.js';
export {
  type AgentBootMethod,
  type Database,
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
  WorkEvent,
} from './schema.js';
export {
  type ReadinessOptions,
  readyFor,
  type Selection,
  type SelectionRow,
  type SelectionSource,
  selectionFor,
} from './selection.js';
export { Session, type SessionOptions, type SessionState } from './session.js';
export type { FinishTags, TagName } from './tags.js';
export { Work, type WorkState } from './work.js';
export type { WorkCandidate } from './work-candidate.js';
