import type { IncomingMessage, ServerResponse } from 'node:http';
import { constants, type Http2ServerRequest, type Http2ServerResponse } from 'node:http2';
import { HeartbeatRequestSchema } from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import { EnrollRequestSchema } from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import { create } from '@bufbuild/protobuf';
import { Code, ConnectError } from '@connectrpc/connect';
import { codeToHttpStatus, errorToJsonBytes } from '@connectrpc/connect/protocol-connect';
import type { Heartbeats } from './agent-callback.js';
import type { Enrollments } from './enrollment.js';
import { encodeGrpcMessage } from './grpc-headers.js';
import { type Overrun, overrunMessage, type RequestBudget } from './limits.js';
import { log } from './log.js';
import { peerKeyOf } from './peer-key.js';
import { ENROLL_PATH } from './routes.js';

type Request = IncomingMessage | Http2ServerRequest;
type Response = ServerResponse | Http2ServerResponse;

/**
 * The gRPC library's requests (Connect, gRPC-Web, gRPC with JSON; HTTP/1.1
 * and HTTP/2), held to what the lean path holds its calls to before the
 * library reads them:
 *
 * - A connection without a key is refused before the body is read: the
 *   refusal of a call without one (counted as every refusal:
 *   `Enrollments.answer` for Enroll's path, `Heartbeats.answer` for any other), as
 *   a Connect error with its HTTP status, and `grpc-status` and
 *   `grpc-message` for gRPC and gRPC-Web clients, which read those.
 * - The body's bytes are held against `budget` until the answer is sent
 *   (or the client went); a request that would pass its connection's share
 *   or the server's, or that is not answered within `requestTimeout`, is
 *   cut off: its HTTP/2 stream reset (ENHANCE_YOUR_CALM), its HTTP/1.1
 *   connection closed. The library has answered nothing yet (it answers
 *   once its handler did), so there is no answer to spoil. What a gzipped
 *   body inflates to inside the library is not counted (at most 4 MiB a
 *   request, `readMaxBytes`): agents call the lean path.
 */
export function libraryRequests(
  library: (request: Request, response: Response) => void,
  heartbeats: Heartbeats,
  enrollments: Enrollments,
  budget: RequestBudget,
): (request: Request, response: Response) => void {
  return (request, response) => {
    if (peerKeyOf(request) === undefined) {
      const refused: Promise<unknown> =
        request.url === ENROLL_PATH
          ? enrollments.answer(create(EnrollRequestSchema), undefined)
          : heartbeats.answer(create(HeartbeatRequestSchema), undefined);
      refused.then(
        () => refuse(request, response, new ConnectError('no client certificate', Code.Unauthenticated)),
        (error: unknown) => refuse(request, response, error),
      );
      return;
    }
    holdBody(request, response, budget);
    library(request, response);
  };
}

/**
 * Counts each chunk of the body as the request takes it in, until the
 * answer is sent or the client went, where node:http
 * and node:http2's compatibility layer hand it over (its `push`), without
 * reading it: the library reads the body when it wants, and a listener of
 * `data` would start the flow before it does (its first chunks lost to it).
 */
function holdBody(request: Request, response: Response, budget: RequestBudget): void {
  const connection = 'stream' in request ? request.stream.session : request.socket;
  const body = budget.hold(connection ?? request);
  let whole = false;
  const cutOff = (overrun: Overrun) => {
    log.server('cut off a request to %s: %s', request.url, overrunMessage(overrun, budget.limits, whole));
    body.release();
    if ('stream' in request) request.stream.close(constants.NGHTTP2_ENHANCE_YOUR_CALM);
    else request.socket.destroy();
  };
  const overtime = setTimeout(() => cutOff(budget.overrun('requestTimeout')), budget.limits.requestTimeout);
  overtime.unref();
  const push = request.push;
  request.push = (chunk: unknown, encoding?: BufferEncoding) => {
    if (chunk === null) whole = true;
    else if (chunk instanceof Uint8Array) {
      const overrun = body.take(chunk.length);
      if (overrun !== undefined) {
        cutOff(overrun);
        return false;
      }
    }
    return push.call(request, chunk, encoding);
  };
  // Sent, or its client gone: the library holds the request no more, but for a handler still at the database.
  response.once('close', () => {
    clearTimeout(overtime);
    body.release();
  });
}

/** A refusal as the Connect protocol writes it, with gRPC's status headers beside it. */
function refuse(request: Request, response: Response, error: unknown): void {
  const refusal = ConnectError.from(error);
  const body = errorToJsonBytes(refusal, {});
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': body.length,
    'grpc-status': refusal.code,
    'grpc-message': encodeGrpcMessage(refusal.rawMessage),
  };
  // HTTP/1.1 cannot leave the rest of a body unread on a connection that goes on.
  if (!('stream' in request)) headers.connection = 'close';
  response.writeHead(codeToHttpStatus(refusal.code), headers);
  // The rest of an HTTP/2 body is not wanted: the stream is reset with NO_ERROR once the answer is out.
  response.end(body, () => {
    if ('stream' in request && !request.stream.closed) request.stream.close(constants.NGHTTP2_NO_ERROR);
  });
}
