import { AgentCallback as AgentCallbackUnderAgentApi } from '@bmaas/api/cloud/agent/api/agent_pb';
import {
  AgentCallback,
  type HeartbeatRequestSchema,
  type HeartbeatResponseSchema,
} from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import { AgentEnrollment } from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import type { GenService } from '@bufbuild/protobuf/codegenv2';
import type { ConnectRouter } from '@connectrpc/connect';
import type { Heartbeats } from './agent-callback.js';
import type { Enrollments } from './enrollment.js';
import { peerKey } from './peer-key.js';

/** A service agents call Heartbeat on, with this package's messages. */
export type HeartbeatService = GenService<{
  heartbeat: { methodKind: 'unary'; input: typeof HeartbeatRequestSchema; output: typeof HeartbeatResponseSchema };
}>;

/**
 * The service names Heartbeat is answered on, one entry each: every route
 * below, on the lean gRPC path and through the gRPC library alike, is made
 * from this table, and every entry is answered by the one `Heartbeats`. A service added here must take this package's
 * messages (message names are not on the wire: a .proto may declare
 * another service name whose Heartbeat takes `cloud.bmaas.server.api`'s
 * HeartbeatRequest and HeartbeatResponse).
 */
export const HEARTBEAT_SERVICES: readonly HeartbeatService[] = [
  AgentCallback,
  // `cloud.agent.api.AgentCallback`, as the current upstream agent names the service (its .proto moved to
  // cloud/agent/api/agent.proto in 2025): its messages are this package's under another package name, field for
  // field (@bmaas/api's test/wire-format.test.ts checks each), so both paths serve it with this package's messages: the
  // lean path decodes and encodes them by this package's schemas, the library reads and writes their fields by name.
  AgentCallbackUnderAgentApi as unknown as HeartbeatService,
];

/** The `:path` of Heartbeat on every service name of {@link HEARTBEAT_SERVICES}: the lean path's Heartbeat calls. */
export const HEARTBEAT_PATHS: ReadonlySet<string> = new Set(
  HEARTBEAT_SERVICES.map((service) => `/${service.typeName}/${service.method.heartbeat.name}`),
);

/** The `:path` of AgentEnrollment.Enroll. */
export const ENROLL_PATH = `/${AgentEnrollment.typeName}/${AgentEnrollment.method.enroll.name}`;

/**
 * The gRPC library's routes: Heartbeat on every service name, and Enroll,
 * for every protocol and encoding the lean path leaves to it (Connect,
 * gRPC-Web, gRPC with JSON) and for whatever else reaches it.
 */
export function libraryRoutes(heartbeats: Heartbeats, enrollments: Enrollments): (router: ConnectRouter) => void {
  return (router) => {
    for (const service of HEARTBEAT_SERVICES) {
      router.service(service, {
        heartbeat: (request, context) => heartbeats.answer(request, context.values.get(peerKey)),
      });
    }
    router.service(AgentEnrollment, {
      enroll: (request, context) => enrollments.answer(request, context.values.get(peerKey)),
    });
  };
}
