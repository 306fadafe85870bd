/**
 * The BMaaS server: agents call back to it after takeover and heartbeat over
 * gRPC (`cloud.bmaas.server.api.AgentCallback`, or `cloud.agent.api.AgentCallback`
 * as the current upstream agent names it), authenticated by the ed25519 key
 * they returned in TakeoverSuccess; heartbeats and the reports they carry go
 * into the BMDB, and each answer carries the machine's pending OS
 * installation request. The messages under the newer name are exported as
 * `agentApi`. An agent its machine's BMC booted, which handed no key back,
 * enrolls first (`cloud.bmaas.server.api.AgentEnrollment`, this project's
 * extension) with its machine's one-time enrollment token.
 *
 * @packageDocumentation
 */

// The service, and the messages an agent sends it and gets back (the
// installation request among them), from @bmaas/api, which holds the rest of
// the generated code. The same service under the current upstream agent's name, with
// its messages, is `agentApi`.
export * as agentApi from '@bmaas/api/cloud/agent/api/agent_pb';
export {
  type DiskImageInstallationRequest,
  DiskImageInstallationRequest_Compression,
  DiskImageInstallationRequestSchema,
} from '@bmaas/api/cloud/agent/api/disk_image_pb';
export {
  AgentCallback,
  type AgentHardwareReport,
  AgentHardwareReportSchema,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
  type OSInstallationReport,
  OSInstallationReportSchema,
  type OSInstallationRequest,
  OSInstallationRequestSchema,
} from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
export {
  AgentEnrollment,
  type EnrollRequest,
  EnrollRequestSchema,
  type EnrollResponse,
  EnrollResponseSchema,
} from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
export { BmaasServerError, ListenError, ServerTlsError } from './errors.js';
export type { ServerLimits } from './limits.js';
export { BmaasServer, type BmaasServerOptions } from './server.js';
export { loadServerTls, type SelfSignedTlsOptions, type ServerTls, selfSignedServerTls } from './tls.js';
