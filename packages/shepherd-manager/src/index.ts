/**
 * The shepherd: brings machines in from a provider, starts the agent on each
 * over SSH, and power-cycles the ones whose agent went silent, all through the BMDB;
 * and boots the agent through the BMC of machines with no OS to take over (the agent booter),
 * serving them the agent image and each boot's files.
 *
 * @packageDocumentation
 */

export { TakeoverResponseSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
export {
  type AgentBootControl,
  type AgentBootEnd,
  AgentBootError,
  type AgentBootMedia,
  type AgentBootStarted,
} from './agent-boot.js';
export {
  AgentBootFiles,
  AgentBootFilesError,
  type AgentBootFilesOptions,
  type AgentBootRequest,
  type PreparedAgentBoot,
} from './agent-boot-files.js';
export {
  AgentBootConfigRefetchedError,
  AgentBooter,
  type AgentBooterOptions,
  AgentEnrollmentTimeoutError,
} from './agent-booter.js';
export {
  AgentResponseError,
  type AgentResponseRejection,
  type AgentTakeover,
  encodeTakeoverInit,
  parseTakeoverResponse,
  type TakeoverInitParams,
} from './agent-protocol.js';
export type { AgentBootFilesLimits } from './boot-files/limits.js';
export {
  type HostKeyPinStore,
  HostKeyStoreError,
  JsonFileHostKeyPinStore,
  MemoryHostKeyPinStore,
} from './host-key-pins.js';
export {
  AgentExecutionError,
  Initializer,
  type InitializerOptions,
  NoAddressError,
} from './initializer.js';
export { type AcceptedPowerCommand, type PowerControl, PowerOutcomeUnknownError } from './power.js';
export {
  type PowerActionKind,
  PowerActionNotRecordedError,
  type PowerActionRequest,
  type PowerActionResult,
  PowerActions,
  type PowerReading,
} from './power-actions.js';
export { PowerSync, type PowerSyncOptions } from './power-sync.js';
export {
  Availability,
  type CreateMachineRequest,
  type Machine,
  MachineNotFoundError,
  NotImplementedError,
  type Provider,
  ShepherdError,
} from './provider.js';
export {
  ProviderDiscrepancyError,
  Provisioner,
  type ProvisionerOptions,
  type ReconcileReport,
} from './provisioner.js';
export { Recoverer, type RecovererOptions } from './recoverer.js';
export {
  HostKeyMismatchError,
  SshAbortedError,
  SshDialError,
  SshError,
  SshExecError,
  SshOutputLimitError,
  SshUploadError,
} from './ssh/errors.js';
export { Ssh2Client, type Ssh2ClientOptions } from './ssh/ssh2-client.js';
export type { SshClient, SshConnection, SshDialOptions, SshExecResult, SshTarget } from './ssh-client.js';
export { SshKey, SshKeyError, type SshKeyOptions, type SshKeySource } from './ssh-key.js';
