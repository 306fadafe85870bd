/**
 * The BMaaS server: agents call back to it after takeover and heartbeat over
 * gRPC (`cloud.bmaas.server.api.AgentCallback`), authenticated by the
 * ed25519 key they returned in TakeoverSuccess; heartbeats and the reports
 * they carry go into the BMDB.
 *
 * @packageDocumentation
 */

export { BmaasServerError, ListenError, ServerTlsError } from './errors.js';
// The service, and the messages an agent sends it and gets back; the rest of
// the generated code stays in src/gen/.
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
} from './gen/cloud/bmaas/server/api/agent_pb.js';
export { BmaasServer, type BmaasServerOptions } from './server.js';
export { loadServerTls, type SelfSignedTlsOptions, type ServerTls, selfSignedServerTls } from './tls.js';
export { certificatePem, type SelfSignedOptions, selfSignedCertificate } from './x509.js';
