import { constants, type IncomingHttpHeaders, type ServerHttp2Stream } from 'node:http2';
import { Code, ConnectError } from '@connectrpc/connect';
import { compressionGzip } from '@connectrpc/connect-node';
import { encodeGrpcMessage, parseGrpcTimeout } from './grpc-headers.js';
import { type HeldBody, type Overrun, overrunMessage, type RequestBudget } from './limits.js';
import { log } from './log.js';

/** Upstream gRPC's default ceiling on a received message, before and after decompression. */
export const READ_MAX_BYTES = 4 * 1024 * 1024;

/** The request encodings taken besides identity; any other is answered UNIMPLEMENTED naming these. */
const ACCEPTED_ENCODINGS = 'gzip';

/** Timers cannot wait longer (about 24.8 days); a later deadline is as good as none. */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/**
 * A unary method served by {@link serveUnaryCall}: how its request is read,
 * its answer written, and who answers (given the call's stream, for what
 * its connection proves); `admit` may answer a call before its body is
 * read (a refusal of what its connection lacks), or leave it (`undefined`).
 */
export interface UnaryRoute<Request, Response> {
  decode(message: Uint8Array): Request;
  encode(response: Response): Uint8Array;
  answer(request: Request, stream: ServerHttp2Stream): Promise<Response>;
  admit(stream: ServerHttp2Stream): Promise<Response> | undefined;
}

const OK_HEADERS = {
  [constants.HTTP2_HEADER_STATUS]: 200,
  [constants.HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc+proto',
};
const OK_TRAILERS = { 'grpc-status': '0' };

/**
 * Serves one call of a unary gRPC method on its HTTP/2 stream, as the gRPC
 * over HTTP/2 protocol has it, with what a gRPC library spends per call
 * left out (no request or response objects, no async iterables, no abort
 * signals): the request's one length-prefixed message is read as it comes,
 * decoded and answered; the answer is headers, one message and the status
 * in trailers, or a refusal in headers alone ("Trailers-Only").
 *
 * - `grpc-timeout`: a call not answered by its deadline is answered
 *   DEADLINE_EXCEEDED then (the route's answer, when it comes, is dropped);
 *   a value that is no timeout is INVALID_ARGUMENT.
 * - `grpc-encoding` identity or gzip; any other is UNIMPLEMENTED with
 *   `grpc-accept-encoding`. A compressed message without an encoding is
 *   INTERNAL. Answers are not compressed.
 * - A message over {@link READ_MAX_BYTES}, announced or inflated, is
 *   RESOURCE_EXHAUSTED as soon as its length prefix arrives (or its
 *   inflating passes the limit); a second message is UNIMPLEMENTED as soon
 *   as it begins. Either way the rest of the body is never read: the stream
 *   is reset after the answer, as HTTP/2 lets a server that answered early.
 * - A body that ends inside the length prefix or the message is
 *   INVALID_ARGUMENT, an empty one UNIMPLEMENTED, a message that does not
 *   decode INTERNAL.
 * - A client that resets its stream, or whose connection drops, is not
 *   answered; its request, if whole, was handed to the route regardless.
 * - The route's `admit` answering: that answer, before a byte of the body
 *   is read (the rest is never read).
 * - Bytes of the body, and of a gzipped message as it inflated, are held
 *   against `budget` until the route answered (past the call's answer when
 *   that came first: the route still holds the request): a chunk that would
 *   pass its connection's share, or the server's, is RESOURCE_EXHAUSTED; a
 *   call not answered within its `requestTimeout` is DEADLINE_EXCEEDED
 *   (saying whether its body was whole). Either names the limit, and the
 *   stream is reset after the answer.
 *
 * The codes and messages are those `@connectrpc/connect` answers with, so a
 * call answers the same here as through the library; `grpc-message` is
 * percent-encoded as the gRPC spec says.
 */
export function serveUnaryCall<Request, Response>(
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  route: UnaryRoute<Request, Response>,
  budget: RequestBudget,
): void {
  let answered = false;
  // The route has the request: its bytes stay held until the route answers, even past the call's own answer.
  let answering = false;
  let whole = false;
  let deadline: NodeJS.Timeout | undefined;
  // The budget's requestTimeout, from the headers to the answer.
  let overtime: NodeJS.Timeout | undefined;
  // The request's bytes held against the budget, from the first one read until it is answered.
  let held: HeldBody | undefined;
  // The request's bytes: the first chunk alone, which usually holds the whole message, or all of them.
  let first: Buffer | undefined;
  let chunks: Buffer[] | undefined;
  let received = 0;
  let messageLength = -1;

  /** Whether this is the call's first answer (the deadline then stops); later ones are dropped. */
  const settle = (): boolean => {
    if (answered) return false;
    answered = true;
    if (deadline !== undefined) clearTimeout(deadline);
    clearTimeout(overtime);
    if (!answering) held?.release();
    return true;
  };
  const refuse = (error: unknown) => {
    if (settle()) respondWithError(stream, error);
  };
  const respond = (response: Response) => {
    if (!settle() || stream.closed) return;
    try {
      const message = route.encode(response);
      const framed = Buffer.allocUnsafe(5 + message.length);
      framed[0] = 0;
      framed.writeUInt32BE(message.length, 1);
      framed.set(message, 5);
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      // 'wantTrailers' comes once per stream: `on` spares the wrapper `once` makes.
      stream.on('wantTrailers', sendOkTrailers);
      stream.end(framed);
    } catch (error) {
      giveUp(stream, error);
    }
  };
  const answer = (message: Uint8Array) => {
    let request: Request;
    try {
      request = route.decode(message);
    } catch (error) {
      refuse(new ConnectError(`parse binary: ${(error as Error).message}`, Code.Internal));
      return;
    }
    answering = true;
    route.answer(request, stream).then(
      (response) => {
        answering = false;
        held?.release();
        respond(response);
      },
      (error: unknown) => {
        answering = false;
        held?.release();
        refuse(error);
      },
    );
  };

  stream.on('error', ignore);
  const encoding = headers['grpc-encoding'];
  const gzip = encoding === 'gzip';
  if (!gzip && encoding !== undefined && encoding !== 'identity') {
    const error = new ConnectError(
      `unknown compression "${encoding}": supported encodings are ${ACCEPTED_ENCODINGS}`,
      Code.Unimplemented,
      { 'grpc-accept-encoding': ACCEPTED_ENCODINGS },
    );
    refuse(error);
    return;
  }
  const timeout = headers['grpc-timeout'];
  if (timeout !== undefined) {
    const ms = typeof timeout === 'string' ? parseGrpcTimeout(timeout) : undefined;
    if (ms === undefined) {
      refuse(new ConnectError(`protocol error: invalid grpc timeout value: ${timeout}`, Code.InvalidArgument));
      return;
    }
    if (ms <= LONGEST_TIMER_MS) {
      deadline = setTimeout(() => refuse(new ConnectError('the operation timed out', Code.DeadlineExceeded)), ms);
      deadline.unref();
    }
  }

  const early = route.admit(stream);
  if (early !== undefined) {
    early.then(respond, refuse);
    return;
  }
  // The connection is there while its stream is open; a stream whose connection went is not served.
  const body = budget.hold(stream.session ?? stream);
  held = body;
  const cutOff = (overrun: Overrun) =>
    refuse(
      new ConnectError(
        overrunMessage(overrun, budget.limits, whole),
        overrun === 'requestTimeout' ? Code.DeadlineExceeded : Code.ResourceExhausted,
      ),
    );
  overtime = setTimeout(() => cutOff(budget.overrun('requestTimeout')), budget.limits.requestTimeout);
  overtime.unref();
  stream.on('close', () => {
    clearTimeout(overtime);
    if (!answering) body.release();
  });

  stream.on('data', (chunk: Buffer) => {
    if (answered) return;
    const overrun = body.take(chunk.length);
    if (overrun !== undefined) return cutOff(overrun);
    received += chunk.length;
    if (first === undefined) first = chunk;
    else if (chunks === undefined) chunks = [first, chunk];
    else chunks.push(chunk);
    if (messageLength < 0 && received >= 5) {
      messageLength = (chunks ? Buffer.concat(chunks) : first).readUInt32BE(1);
      if (messageLength > READ_MAX_BYTES) {
        const error = new ConnectError(
          `message size ${messageLength} is larger than configured readMaxBytes ${READ_MAX_BYTES}`,
          Code.ResourceExhausted,
        );
        return refuse(error);
      }
    }
    if (messageLength >= 0 && received > 5 + messageLength) {
      refuse(new ConnectError('protocol error: received extra input message for unary method', Code.Unimplemented));
    }
  });
  stream.on('end', () => {
    whole = true;
    if (answered) return;
    if (first === undefined) {
      return refuse(new ConnectError('protocol error: missing input message for unary method', Code.Unimplemented));
    }
    if (messageLength < 0 || received < 5 + messageLength) {
      return refuse(new ConnectError('protocol error: incomplete envelope', Code.InvalidArgument));
    }
    const framed = chunks ? Buffer.concat(chunks, received) : first;
    const message = framed.subarray(5);
    if ((framed.readUInt8(0) & 1) === 0) return answer(message);
    if (!gzip) {
      return refuse(new ConnectError('received compressed envelope, but do not know how to decompress', Code.Internal));
    }
    compressionGzip.decompress(message, READ_MAX_BYTES).then((inflated) => {
      const overrun = body.take(inflated.length);
      if (overrun !== undefined) cutOff(overrun);
      else answer(inflated);
    }, refuse);
  });
}

/** Errors of a stream (a client's reset, a dropped connection) end its call, unanswered. */
function ignore(): void {}

function sendOkTrailers(this: ServerHttp2Stream): void {
  this.sendTrailers(OK_TRAILERS);
}

/** Answers with `error`'s status (INTERNAL for what is no ConnectError), unless the stream is gone. */
function respondWithError(stream: ServerHttp2Stream, error: unknown): void {
  if (stream.closed || stream.headersSent) return;
  try {
    writeRefusal(stream, error);
  } catch (failure) {
    giveUp(stream, failure);
  }
}

/** A stream that could not be answered (its connection went away meanwhile): reset, and said in the log. */
function giveUp(stream: ServerHttp2Stream, error: unknown): void {
  log.server('could not answer a call: %s', (error as Error).message);
  stream.destroy();
}

/**
 * A refusal in headers alone (Trailers-Only), then, if the client is still
 * sending its body, a reset with NO_ERROR: the rest is not wanted.
 */
function writeRefusal(stream: ServerHttp2Stream, error: unknown): void {
  const refusal =
    error instanceof ConnectError
      ? error
      : new ConnectError('internal error', Code.Internal, undefined, undefined, error);
  const headers: Record<string, string | number> = { ...OK_HEADERS };
  refusal.metadata.forEach((value, key) => {
    headers[key] = value;
  });
  headers['grpc-status'] = refusal.code;
  headers['grpc-message'] = encodeGrpcMessage(refusal.rawMessage);
  stream.respond(headers, { endStream: true });
  if (!stream.readableEnded) stream.close(constants.NGHTTP2_NO_ERROR);
}
