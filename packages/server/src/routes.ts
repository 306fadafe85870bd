import type { IncomingHttpHeaders } from 'node:http2';
import { AgentCallback as AgentCallbackUnderAgentApi } from '@bmaas/api/cloud/agent/api/agent_pb';
import {
  AgentCallback,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
} from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import {
  AgentEnrollment,
  type EnrollRequest,
  EnrollRequestSchema,
  type EnrollResponse,
  EnrollResponseSchema,
} from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import type { GenService } from '@bufbuild/protobuf/codegenv2';
import type { ConnectRouter } from '@connectrpc/connect';
import type { HeartbeatHandler } from './agent-callback.js';
import type { EnrollHandler } from './enrollment.js';
import type { UnaryRoute } from './grpc-unary.js';
import { connectionPeerKey, peerKey } from './peer-key.js';

/** A service agents call Heartbeat on, with this package's messages. */
export type HeartbeatService = GenService<{
  heartbeat: { methodKind: 'unary'; input: typeof HeartbeatRequestSchema; output: typeof HeartbeatResponseSchema };
}>;

/**
 * The service names Heartbeat is answered on, one entry each: every route
 * below, on the lean gRPC path and through the gRPC library alike, is made
 * from this table, and every entry answers through the one
 * {@link HeartbeatHandler}. A service added here must take this package's
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

/** A route of the lean path: Heartbeat's, or Enroll's. */
export type LeanRoute = UnaryRoute<HeartbeatRequest, HeartbeatResponse> | UnaryRoute<EnrollRequest, EnrollResponse>;

/**
 * The lean gRPC path's routes, by `:path`: protobuf gRPC calls of Heartbeat
 * on every service name, and of AgentEnrollment.Enroll.
 */
export function grpcRoutes(handler: HeartbeatHandler, enroll: EnrollHandler): ReadonlyMap<string, LeanRoute> {
  const route: UnaryRoute<HeartbeatRequest, HeartbeatResponse> = {
    decode: (message) => fromBinary(HeartbeatRequestSchema, message),
    // Whatever the handler answers, installation requests included, is encoded here: nothing is pre-built.
    encode: (response) => toBinary(HeartbeatResponseSchema, response),
    answer: (request, stream) => handler(request, connectionPeerKey(stream.session)),
    // A connection without a key is refused before its body is read: the handler refuses any call without
    // one (and counts it) whatever it asks, so it is asked with an empty request.
    admit: (stream) =>
      connectionPeerKey(stream.session) === undefined ? handler(create(HeartbeatRequestSchema), undefined) : undefined,
  };
  const enrollRoute: UnaryRoute<EnrollRequest, EnrollResponse> = {
    decode: (message) => fromBinary(EnrollRequestSchema, message),
    encode: (response) => toBinary(EnrollResponseSchema, response),
    answer: (request, stream) => enroll(request, connectionPeerKey(stream.session)),
    // As Heartbeat's: a connection without a key is refused (and counted) before its body is read.
    admit: (stream) =>
      connectionPeerKey(stream.session) === undefined ? enroll(create(EnrollRequestSchema), undefined) : undefined,
  };
  return new Map<string, LeanRoute>([
    ...HEARTBEAT_SERVICES.map((service): [string, LeanRoute] => [
      `/${service.typeName}/${service.method.heartbeat.name}`,
      route,
    ]),
    [`/${AgentEnrollment.typeName}/${AgentEnrollment.method.enroll.name}`, enrollRoute],
  ]);
}

/**
 * The gRPC library's routes: Heartbeat on every service name, and Enroll,
 * for every protocol and encoding the lean path leaves to it (Connect,
 * gRPC-Web, gRPC with JSON) and for whatever else reaches it.
 */
export function libraryRoutes(handler: HeartbeatHandler, enroll: EnrollHandler): (router: ConnectRouter) => void {
  return (router) => {
    for (const service of HEARTBEAT_SERVICES) {
      router.service(service, { heartbeat: (request, context) => handler(request, context.values.get(peerKey)) });
    }
    router.service(AgentEnrollment, { enroll: (request, context) => enroll(request, context.values.get(peerKey)) });
  };
}

/**
 * The route a stream takes on the lean path: a POST with a protobuf gRPC
 * content type to one of `routes`; `undefined` leaves the stream to the
 * library, which answers everything else as it always has (Connect,
 * gRPC-Web, JSON, unknown methods, wrong content types and methods).
 */
export function leanRoute<Route>(routes: ReadonlyMap<string, Route>, headers: IncomingHttpHeaders): Route | undefined {
  const path = headers[':path'];
  if (path === undefined || headers[':method'] !== 'POST') return undefined;
  const contentType = headers['content-type'];
  if (contentType !== 'application/grpc' && contentType !== 'application/grpc+proto') return undefined;
  return routes.get(path);
}
