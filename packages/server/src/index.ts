/**
 * The BMaaS server: agents call back to it after takeover and heartbeat over
 * gRPC (`cloud.bmaas.server.api.AgentCallback`, or `cloud.agent.api.AgentCallback`
 * as the current upstream agent names it), authenticated by the ed25519 key
 * they returned in TakeoverSuccess; heartbeats and the reports they carry go
 * into the BMDB, and each answer carries the machine's pending OS
 * installation request. The messages under the newer name are exported as
 * `agentApi`.
 *
 * @packageDocumentation
 */

export { BmaasServerError, ListenError, ServerTlsError } from './errors.js';
export * as agentApi from './gen/cloud/agent/api/agent_pb.js';
export * from './gen/cloud/agent/api/disk_image_pb.js';
export * from './gen/cloud/agent/api/hwreport_pb.js';
export * from './gen/cloud/bmaas/server/api/agent_pb.js';
export { BmaasServer, type BmaasServerOptions } from './server.js';
export { loadServerTls, type SelfSignedTlsOptions, type ServerTls, selfSignedServerTls } from './tls.js';
export { certificatePem, type SelfSignedOptions, selfSignedCertificate } from './x509.js';
