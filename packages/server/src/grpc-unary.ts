import { constants, type IncomingHttpHeaders, type ServerHttp2Stream } from 'node:http2';
import { type DescMessage, fromBinary, type MessageShape, toBinary } from '@bufbuild/protobuf';
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

const OK_HEADERS = {
  [constants.HTTP2_HEADER_STATUS]: 200,
  [constants.HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc+proto',
};
const OK_TRAILERS = { 'grpc-status': '0' };

/**
 * The `:path` of a stream the lean path takes: a POST with a protobuf gRPC
 * content type. `undefined` leaves the stream to the gRPC library, which
 * answers everything else as it always has (Connect, gRPC-Web, JSON,
 * wrong content types and methods).
 */
export function leanPath(headers: IncomingHttpHeaders): string | undefined {
  if (headers[':method'] !== 'POST') return undefined;
  const contentType = headers['content-type'];
  if (contentType !== 'application/grpc' && contentType !== 'application/grpc+proto') return undefined;
  return headers[':path'];
}

/**
 * One call of a unary gRPC method on its HTTP/2 stream, as the gRPC over
 * HTTP/2 protocol has it, with what a gRPC library spends per call left out
 * (no request or response objects, no async iterables, no abort signals):
 * the method's handler opens it ({@link UnaryCall.open}), reads its one
 * length-prefixed message ({@link UnaryCall.read}) and answers it
 * ({@link UnaryCall.answer}): headers, one message and the status in
 * trailers, or a refusal in headers alone ("Trailers-Only").
 *
 * - `grpc-timeout`: a call not answered by its deadline is answered
 *   DEADLINE_EXCEEDED then (the handler's answer, when it comes, is
 *   dropped); a value that is no timeout is INVALID_ARGUMENT.
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
 *   answered; its request, if whole, was handed to the handler regardless.
 * - A handler may answer before reading the body (a refusal of what its
 *   connection lacks): the rest is never read.
 * - Bytes of the body, and of a gzipped message as it inflated, are held
 *   against the budget given to `read` until the handler answered (past the
 *   call's answer when that came first: the handler still holds the
 *   request): a chunk that would pass its connection's share, or the
 *   server's, is RESOURCE_EXHAUSTED; a call not answered within its
 *   `requestTimeout` is DEADLINE_EXCEEDED (saying whether its body was
 *   whole). Either names the limit, and the stream is reset after the
 *   answer.
 * - A call has one timer: its deadline or its `requestTimeout`, whichever
 *   comes first. Whichever fires answers the call, after which the other
 *   has nothing left to cut off.
 *
 * The codes and messages are those `@connectrpc/connect` answers with, so a
 * call answers the same here as through the library; `grpc-message` is
 * percent-encoded as the gRPC spec says.
 */
export class UnaryCall {
  readonly stream: ServerHttp2Stream;
  readonly #gzip: boolean;
  #answered = false;
  /** The handler has the request: its bytes stay held until the handler answers, even past the call's own answer. */
  #answering = false;
  /** The call's one timer: its deadline (`grpc-timeout`), or its `requestTimeout` when reading and that comes first. */
  #timer: NodeJS.Timeout | undefined;
  /** Whether the call's timer was chosen (by `read`, or by `answer` without a read). */
  #timed = false;
  /** Milliseconds from the call's start to its deadline, if it has one a timer can wait for. */
  #deadline: number | undefined;
  /** The request's bytes held against the budget, from the first one read until the handler answers. */
  #held: HeldBody | undefined;

  private constructor(stream: ServerHttp2Stream, gzip: boolean) {
    this.stream = stream;
    this.#gzip = gzip;
  }

  /**
   * The call on `stream`, once its `grpc-encoding` and `grpc-timeout` are
   * ones it can serve; `undefined` when it refused them (the call is
   * answered). Its deadline runs from its {@link UnaryCall.read}, or its
   * {@link UnaryCall.answer} without one, in the same turn.
   */
  static open(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): UnaryCall | undefined {
    stream.on('error', ignore);
    const encoding = headers['grpc-encoding'];
    const gzip = encoding === 'gzip';
    const call = new UnaryCall(stream, gzip);
    if (!gzip && encoding !== undefined && encoding !== 'identity') {
      const error = new ConnectError(
        `unknown compression "${encoding}": supported encodings are ${ACCEPTED_ENCODINGS}`,
        Code.Unimplemented,
        { 'grpc-accept-encoding': ACCEPTED_ENCODINGS },
      );
      call.refuse(error);
      return undefined;
    }
    const timeout = headers['grpc-timeout'];
    if (timeout !== undefined) {
      const ms = typeof timeout === 'string' ? parseGrpcTimeout(timeout) : undefined;
      if (ms === undefined) {
        call.refuse(new ConnectError(`protocol error: invalid grpc timeout value: ${timeout}`, Code.InvalidArgument));
        return undefined;
      }
      if (ms <= LONGEST_TIMER_MS) call.#deadline = ms;
    }
    return call;
  }

  /**
   * Reads the request's one message as it comes, holding its bytes against
   * `budget` until the call is answered, and decodes it as `schema`;
   * resolves with the request, which the caller then answers
   * ({@link UnaryCall.answer}), or with `undefined` once the call was
   * answered instead (a broken or oversized body, a limit passed, its
   * deadline) or its stream closed before the request was whole. Called in
   * the same turn as {@link UnaryCall.open}: the call's deadline and its
   * `requestTimeout` run from here, on one timer, whichever comes first.
   */
  read<Desc extends DescMessage>(budget: RequestBudget, schema: Desc): Promise<MessageShape<Desc> | undefined> {
    const stream = this.stream;
    // The connection is there while its stream is open; a stream whose connection went is not served.
    const body = budget.hold(stream.session ?? stream);
    this.#held = body;
    return new Promise((resolve) => {
      let whole = false;
      const refuse = (error: unknown) => {
        this.refuse(error);
        resolve(undefined);
      };
      const cutOff = (overrun: Overrun) =>
        refuse(
          new ConnectError(
            overrunMessage(overrun, budget.limits, whole),
            overrun === 'requestTimeout' ? Code.DeadlineExceeded : Code.ResourceExhausted,
          ),
        );
      // Whichever of the deadline and the requestTimeout comes first answers the call: the other would find nothing
      // left to cut off, so it gets no timer.
      this.#timed = true;
      const { requestTimeout } = budget.limits;
      const deadline = this.#deadline;
      if (deadline !== undefined && deadline <= requestTimeout) this.#startDeadline(deadline);
      else {
        this.#timer = setTimeout(() => cutOff(budget.overrun('requestTimeout')), requestTimeout);
        this.#timer.unref();
      }
      // A stream closed before its answer (a reset, a dropped connection) is not answered; a request whole by then
      // still goes to the handler, which holds its bytes until it answers.
      stream.on('close', () => {
        clearTimeout(this.#timer);
        if (!this.#answering) body.release();
        if (!whole) resolve(undefined);
      });

      // The request's bytes: the first chunk alone, which usually holds the whole message, or all of them.
      let first: Buffer | undefined;
      let chunks: Buffer[] | undefined;
      let received = 0;
      let messageLength = -1;
      stream.on('data', (chunk: Buffer) => {
        if (this.#answered) return;
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
        if (this.#answered) return resolve(undefined);
        if (first === undefined) {
          return refuse(new ConnectError('protocol error: missing input message for unary method', Code.Unimplemented));
        }
        if (messageLength < 0 || received < 5 + messageLength) {
          return refuse(new ConnectError('protocol error: incomplete envelope', Code.InvalidArgument));
        }
        const framed = chunks ? Buffer.concat(chunks, received) : first;
        const message = framed.subarray(5);
        const decode = (bytes: Uint8Array) => {
          let request: MessageShape<Desc>;
          try {
            request = fromBinary(schema, bytes);
          } catch (error) {
            return refuse(new ConnectError(`parse binary: ${(error as Error).message}`, Code.Internal));
          }
          this.#answering = true;
          resolve(request);
        };
        if ((framed.readUInt8(0) & 1) === 0) return decode(message);
        if (!this.#gzip) {
          return refuse(
            new ConnectError('received compressed envelope, but do not know how to decompress', Code.Internal),
          );
        }
        compressionGzip.decompress(message, READ_MAX_BYTES).then((inflated) => {
          const overrun = body.take(inflated.length);
          if (overrun !== undefined) cutOff(overrun);
          else decode(inflated);
        }, refuse);
      });
    });
  }

  /**
   * Answers with what `answer` resolves to, encoded as `schema`, or with its
   * rejection's status (INTERNAL for what is no ConnectError); unless the
   * call was answered already (its deadline), or its stream is gone. The
   * request's bytes are given back as `answer` settles.
   */
  answer<Desc extends DescMessage>(answer: Promise<MessageShape<Desc>>, schema: Desc): void {
    if (!this.#timed) {
      this.#timed = true;
      if (this.#deadline !== undefined) this.#startDeadline(this.#deadline);
    }
    answer.then(
      (response) => {
        this.#answering = false;
        this.#held?.release();
        this.#respond(schema, response);
      },
      (error: unknown) => {
        this.#answering = false;
        this.#held?.release();
        this.refuse(error);
      },
    );
  }

  /** Answers DEADLINE_EXCEEDED `ms` from now, unless answered before. */
  #startDeadline(ms: number): void {
    this.#timer = setTimeout(() => this.refuse(new ConnectError('the operation timed out', Code.DeadlineExceeded)), ms);
    this.#timer.unref();
  }

  /** Answers with `error`'s status, if this is the call's first answer. */
  refuse(error: unknown): void {
    if (this.#settle()) respondWithError(this.stream, error);
  }

  #respond<Desc extends DescMessage>(schema: Desc, response: MessageShape<Desc>): void {
    const stream = this.stream;
    if (!this.#settle() || stream.closed) return;
    try {
      const message = toBinary(schema, response);
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
  }

  /**
   * Whether this is the call's first answer (its timer then stops, and its
   * request's bytes go back unless the handler still holds it); later ones
   * are dropped.
   */
  #settle(): boolean {
    if (this.#answered) return false;
    this.#answered = true;
    clearTimeout(this.#timer);
    if (!this.#answering) this.#held?.release();
    return true;
  }
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
