import { createSecureServer, type Http2SecureServer, type ServerHttp2Session } from 'node:http2';
import type { AddressInfo } from 'node:net';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { createContextValues } from '@connectrpc/connect';
import { connectNodeAdapter } from '@connectrpc/connect-node';
import type { Registry } from 'prom-client';
import { agentCallbacks } from './agent-callback.js';
import { ListenError } from './errors.js';
import { AgentCallback as AgentCallbackOfAgentApi } from './gen/cloud/agent/api/agent_pb.js';
import { AgentCallback } from './gen/cloud/bmaas/server/api/agent_pb.js';
import { log } from './log.js';
import { ServerMetrics } from './metrics.js';
import { peerKey, peerKeyOf } from './peer-key.js';
import type { ServerTls } from './tls.js';

/** Options of {@link BmaasServer.start}. */
export interface BmaasServerOptions {
  /** The BMDB heartbeats are recorded in. */
  readonly bmdb: BMDB;
  /** Where to listen; port 0 picks a free one. */
  readonly listen: { readonly host: string; readonly port: number };
  /** The server's certificate and key (PEM). */
  readonly tls: Pick<ServerTls, 'cert' | 'key'>;
  /** Register request metrics here. */
  readonly metrics?: Registry;
}

/**
 * The BMaaS server: AgentCallback over gRPC (and Connect and gRPC-Web) on
 * HTTP/2 with TLS, under both service names (`cloud.bmaas.server.api`,
 * `cloud.agent.api`). It asks every client for a certificate and checks no
 * chain: an agent's is self-signed over its ed25519 key, and what
 * authenticates a heartbeat is that key being its machine's (see
 * `BMDB.recordAgentHeartbeat`).
 *
 * @example
 * ```ts
 * const server = await BmaasServer.start({ bmdb, listen: { host: '0.0.0.0', port: 8443 }, tls });
 * // … until told to stop:
 * await server.close();
 * ```
 */
export class BmaasServer {
  readonly #server: Http2SecureServer;
  /** Open HTTP/2 sessions: agents keep theirs between heartbeats. */
  readonly #sessions = new Set<ServerHttp2Session>();

  private constructor(server: Http2SecureServer) {
    this.#server = server;
    server.on('session', (session) => {
      this.#sessions.add(session);
      session.once('close', () => this.#sessions.delete(session));
    });
  }

  /** Starts listening; resolves once it does. */
  static async start(options: BmaasServerOptions): Promise<BmaasServer> {
    const metrics = options.metrics ? new ServerMetrics(options.metrics) : undefined;
    const callbacks = agentCallbacks(options.bmdb, metrics);
    const handler = connectNodeAdapter({
      // Both generations of the upstream agent: the service before and after its move to cloud.agent.api.
      routes: (router) =>
        router.service(AgentCallback, callbacks.bmaas).service(AgentCallbackOfAgentApi, callbacks.agent),
      contextValues: (request) => createContextValues().set(peerKey, peerKeyOf(request)),
      // Heartbeats and their answers are small: compressing them costs more than it saves.
      acceptCompression: [],
      // Upstream gRPC's default ceiling; a hardware report is a few kilobytes.
      readMaxBytes: 4 * 1024 * 1024,
    });
    const server = createSecureServer(
      {
        cert: options.tls.cert,
        key: options.tls.key,
        requestCert: true,
        rejectUnauthorized: false,
        allowHTTP1: true,
      },
      handler,
    );
    // A client that breaks off its handshake or connection is its own business.
    server.on('tlsClientError', (error) => log.server('TLS handshake failed: %s', error.message));
    server.on('sessionError', (error) => log.server('HTTP/2 session failed: %s', error.message));
    const { host, port } = options.listen;
    await new Promise<void>((resolve, reject) => {
      const fail = (error: NodeJS.ErrnoException) =>
        reject(new ListenError(host, port, error.code ?? error.message, { cause: error }));
      server.once('error', fail);
      server.listen(port, host, () => {
        server.off('error', fail);
        resolve();
      });
    });
    const bmaas = new BmaasServer(server);
    log.server('serving AgentCallback (cloud.bmaas.server.api and cloud.agent.api) at %s:%d', host, bmaas.port);
    return bmaas;
  }

  /** The port listened on. */
  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  /**
   * Stops taking connections, lets requests under way end (at most `grace`
   * ms, default 5 s), then closes what is left.
   */
  async close(grace = 5_000): Promise<void> {
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    const timer = setTimeout(() => {
      for (const session of this.#sessions) session.destroy();
    }, grace);
    // Idle agents keep their sessions open between heartbeats: ask them to go.
    for (const session of this.#sessions) session.close();
    await closed;
    clearTimeout(timer);
    log.server('stopped');
  }
}
