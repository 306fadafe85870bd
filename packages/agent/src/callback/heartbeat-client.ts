import {
  AgentCallback,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
} from '@bmaas/api/cloud/agent/api/agent_pb';
import * as older from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import { fromBinary, toBinary } from '@bufbuild/protobuf';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport, type Http2SessionManager } from '@connectrpc/connect-node';
import { type ServerConnectionOptions, serverConnection } from './client-certificate.js';

/**
 * The package of the AgentCallback service the agent calls: `cloud.agent.api`
 * as the current upstream agent does, or `cloud.bmaas.server.api` as it did
 * before 2025. The BMaaS server answers on both; the messages are the same on
 * the wire.
 */
export type AgentService = 'cloud.agent.api' | 'cloud.bmaas.server.api';

/** Where and how the agent calls the server. */
export interface HeartbeatClientOptions extends ServerConnectionOptions {
  readonly service?: AgentService | undefined;
  /** How long one call may take, in milliseconds; 10 s as upstream. */
  readonly timeoutMs?: number | undefined;
}

/**
 * AgentCallback.Heartbeat over gRPC, TLS with the agent's self-signed client
 * certificate, through one HTTP/2 connection kept between calls.
 */
export class HeartbeatClient {
  readonly #call: (request: HeartbeatRequest, signal: AbortSignal | undefined) => Promise<HeartbeatResponse>;
  /** The connection, held here so that {@link close} can end it. */
  readonly #session: Http2SessionManager;

  constructor(options: HeartbeatClientOptions) {
    const { baseUrl, session } = serverConnection(options);
    this.#session = session;
    const transport = createGrpcTransport({
      baseUrl,
      sessionManager: this.#session,
      defaultTimeoutMs: options.timeoutMs ?? 10_000,
    });
    if (options.service === 'cloud.bmaas.server.api') {
      const client: Client<typeof older.AgentCallback> = createClient(older.AgentCallback, transport);
      // The same messages under the older package: converted through their (identical) wire form.
      this.#call = async (request, signal) => {
        const answer = await client.heartbeat(
          fromBinary(older.HeartbeatRequestSchema, toBinary(HeartbeatRequestSchema, request)),
          { signal },
        );
        return fromBinary(HeartbeatResponseSchema, toBinary(older.HeartbeatResponseSchema, answer));
      };
    } else {
      const client = createClient(AgentCallback, transport);
      this.#call = (request, signal) => client.heartbeat(request, { signal });
    }
  }

  /** One heartbeat; rejects with the call's ConnectError when the server refuses it or cannot be reached. */
  heartbeat(request: HeartbeatRequest, signal?: AbortSignal): Promise<HeartbeatResponse> {
    return this.#call(request, signal);
  }

  /** Closes the connection, so that nothing of the client keeps the process alive. */
  close(): void {
    this.#session.abort();
  }
}
