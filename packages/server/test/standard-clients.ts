/**
 * Clients of AgentCallback that share no code with the server: @grpc/grpc-js
 * calling the service as loaded from the .proto by @grpc/proto-loader
 * (protobufjs encodes and decodes), and a raw node:http2 client for what no
 * well-behaved client sends (broken frames, unknown encodings, a body that
 * never ends).
 */
import { type ClientHttp2Session, type ClientHttp2Stream, connect, type IncomingHttpHeaders } from 'node:http2';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  type CallOptions,
  type ChannelOptions,
  Client,
  credentials,
  Metadata,
  type MethodDefinition,
  type ServiceError,
  type StatusObject,
} from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import type { AgentIdentity } from './helpers.js';

const PROTO = fileURLToPath(new URL('../../../proto', import.meta.url));

/** A HeartbeatRequest as protobufjs takes it (camel-cased fields, 64-bit integers as strings). */
export interface ProtobufjsHeartbeatRequest {
  machineId?: string;
  hardwareReport?: { report?: Record<string, unknown>; warning?: string[] };
  installationReport?: { generation?: string; success?: Record<string, never>; error?: { error: string } };
}

/** What protobufjs decoded from a HeartbeatResponse. */
export type ProtobufjsHeartbeatResponse = Record<string, unknown>;

type HeartbeatMethod = MethodDefinition<ProtobufjsHeartbeatRequest, ProtobufjsHeartbeatResponse>;

/** The Heartbeat method of each service name, as proto-loader reads it from the .proto files. */
function heartbeatMethod(service: string): HeartbeatMethod {
  const definition = loadSync(path.join(PROTO, 'cloud/bmaas/server/api/agent.proto'), {
    includeDirs: [PROTO],
    longs: String,
    defaults: false,
    oneofs: true,
  });
  const methods = definition[service];
  if (methods === undefined || !('Heartbeat' in methods)) throw new Error(`${service}.Heartbeat not in the .proto`);
  return methods.Heartbeat as HeartbeatMethod;
}

/** How a grpc-js call ended: its status (code, details, trailers), the headers and the response, if any. */
export interface GrpcJsAnswer {
  readonly status: StatusObject;
  readonly headers: Metadata | undefined;
  readonly response: ProtobufjsHeartbeatResponse | undefined;
  readonly error: ServiceError | undefined;
}

/** A @grpc/grpc-js client of AgentCallback at `port`, trusting `ca`, presenting `identity` (if any). */
export class GrpcJsAgent {
  readonly #client: Client;
  readonly #method: HeartbeatMethod;

  constructor(port: number, ca: string, identity?: AgentIdentity, options: ChannelOptions & { service?: string } = {}) {
    const { service = 'cloud.bmaas.server.api.AgentCallback', ...channelOptions } = options;
    this.#method = heartbeatMethod(service);
    this.#client = new Client(
      `localhost:${port}`,
      credentials.createSsl(
        Buffer.from(ca),
        identity && Buffer.from(identity.key),
        identity && Buffer.from(identity.cert),
      ),
      channelOptions,
    );
  }

  /** Calls Heartbeat (or `path`, to call what the server does not serve) and resolves with how it ended. */
  heartbeat(
    request: ProtobufjsHeartbeatRequest,
    options: CallOptions & { path?: string; metadata?: Metadata } = {},
  ): Promise<GrpcJsAnswer> {
    const { path: methodPath = this.#method.path, metadata = new Metadata(), ...callOptions } = options;
    return new Promise((resolve) => {
      let headers: Metadata | undefined;
      let response: ProtobufjsHeartbeatResponse | undefined;
      let error: ServiceError | undefined;
      let done = 0;
      let status: StatusObject | undefined;
      // The callback and the status event come in either order: resolve after both.
      const settle = () => {
        if (++done === 2 && status) resolve({ status, headers, response, error });
      };
      const call = this.#client.makeUnaryRequest(
        methodPath,
        this.#method.requestSerialize,
        this.#method.responseDeserialize,
        request,
        metadata,
        callOptions,
        (e, value) => {
          error = e ?? undefined;
          response = value;
          settle();
        },
      );
      call.on('metadata', (m) => {
        headers = m;
      });
      call.on('status', (s) => {
        status = s;
        settle();
      });
    });
  }

  close(): void {
    this.#client.close();
  }
}

/** One gRPC length-prefixed message: flags (1: compressed), length, bytes. */
export function grpcFrame(message: Uint8Array, compressed = false): Buffer {
  const frame = Buffer.alloc(5 + message.length);
  frame[0] = compressed ? 1 : 0;
  frame.writeUInt32BE(message.length, 1);
  frame.set(message, 5);
  return frame;
}

/** An answer as it came over HTTP/2, before any gRPC library read it. */
export interface RawAnswer {
  /** Response headers (`:status`, `content-type`, and in a trailers-only answer the status too). */
  readonly headers: IncomingHttpHeaders;
  /** The trailers, when the answer had headers, data and trailers apart. */
  readonly trailers: IncomingHttpHeaders | undefined;
  readonly body: Buffer;
  /** `grpc-status` from the trailers, or the headers of a trailers-only answer. */
  readonly grpcStatus: number | undefined;
  /** `grpc-message`, percent-decoded. */
  readonly grpcMessage: string | undefined;
}

/** A stream opened by {@link RawGrpcClient.open}: write to it as slowly as you like; `answer` settles when it closes. */
export interface RawCall {
  readonly stream: ClientHttp2Stream;
  readonly answer: Promise<RawAnswer>;
}

/** One HTTP/2 connection with TLS (and the agent's certificate, if any) for hand-made gRPC requests. */
export class RawGrpcClient {
  readonly session: ClientHttp2Session;

  constructor(port: number, ca: string, identity?: AgentIdentity) {
    this.session = connect(`https://localhost:${port}`, {
      ca,
      ...(identity && { cert: identity.cert, key: identity.key }),
    });
    this.session.on('error', () => {});
  }

  /** Opens a call with gRPC's headers (or others given) and returns without writing a body. */
  open(headers: Record<string, string> = {}, path = '/cloud.bmaas.server.api.AgentCallback/Heartbeat'): RawCall {
    const stream = this.session.request({
      ':method': 'POST',
      ':path': path,
      'content-type': 'application/grpc',
      te: 'trailers',
      ...headers,
    });
    const answer = new Promise<RawAnswer>((resolve, reject) => {
      let responseHeaders: IncomingHttpHeaders = {};
      let trailers: IncomingHttpHeaders | undefined;
      const chunks: Buffer[] = [];
      stream.on('response', (h) => {
        responseHeaders = h;
      });
      stream.on('trailers', (t) => {
        trailers = t;
      });
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      const settle = () => {
        const statusFrom = trailers ?? responseHeaders;
        const status = statusFrom['grpc-status'];
        const message = statusFrom['grpc-message'];
        resolve({
          headers: responseHeaders,
          trailers,
          body: Buffer.concat(chunks),
          grpcStatus: typeof status === 'string' ? Number(status) : undefined,
          grpcMessage: typeof message === 'string' ? decodeURIComponent(message) : undefined,
        });
      };
      // The answer is whole when the server ends its side, whether or not the client ended its own.
      stream.on('end', settle);
      stream.on('close', settle);
      // A reset after the status (the server refusing the rest of a body) is no failure of the call.
      stream.on('error', (error) => {
        if ((trailers ?? responseHeaders)['grpc-status'] !== undefined) settle();
        else reject(error);
      });
    });
    return { stream, answer };
  }

  /** One whole call: the headers, `body` (written at once) and the end of the stream. */
  call(body: Uint8Array, headers: Record<string, string> = {}, path?: string): Promise<RawAnswer> {
    const { stream, answer } = this.open(headers, path);
    stream.end(body);
    return answer;
  }

  close(): void {
    this.session.destroy();
  }
}
