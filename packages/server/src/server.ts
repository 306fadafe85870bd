import {
  createSecureServer,
  type Http2SecureServer,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import type { TLSSocket } from 'node:tls';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { createContextValues } from '@connectrpc/connect';
import { compressionGzip, connectNodeAdapter } from '@connectrpc/connect-node';
import type { Registry } from 'prom-client';
import { Heartbeats } from './agent-callback.js';
import { Enrollments } from './enrollment.js';
import { ListenError } from './errors.js';
import { leanPath, READ_MAX_BYTES } from './grpc-unary.js';
import { libraryRequests } from './library-requests.js';
import { RequestBudget, type ServerLimits, serverLimits } from './limits.js';
import { log } from './log.js';
import { ServerMetrics } from './metrics.js';
import { peerKey, peerKeyOf } from './peer-key.js';
import { isPhoneHome, phoneHomeHandler } from './phone-home.js';
import { ENROLL_PATH, HEARTBEAT_PATHS, libraryRoutes } from './routes.js';
import type { ServerTls } from './tls.js';

/**
 * Puts the lean path in front of the library: `node:http2` hands every
 * HTTP/2 stream to the one `stream` listener it installed for its
 * request/response API (which the library is a handler of); that listener
 * is taken off and called for the streams the lean path does not take.
 * HTTP/1.1 requests never are streams and go to the library directly.
 */
function routeStreams(
  server: Http2SecureServer,
  heartbeats: Heartbeats,
  enrollments: Enrollments,
  budget: RequestBudget,
): void {
  const listeners = server.listeners('stream');
  const [toLibrary] = listeners;
  if (listeners.length !== 1 || toLibrary === undefined) {
    throw new Error(`node:http2 installed ${listeners.length} stream listeners for its request API, not one`);
  }
  server.removeListener('stream', toLibrary as (...args: unknown[]) => void);
  server.on(
    'stream',
    (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number, rawHeaders: string[]) => {
      const path = leanPath(headers);
      if (path !== undefined && HEARTBEAT_PATHS.has(path)) heartbeats.serve(stream, headers, budget);
      else if (path === ENROLL_PATH) enrollments.serve(stream, headers, budget);
      else toLibrary.call(server, stream, headers, flags, rawHeaders);
    },
  );
}

/**
 * Holds the server's connections to `limits`: at most `connections` open
 * (node:net closes the others as it accepts them; the first of a run of
 * them is logged, each counted), and each closed after `idleTimeout`
 * without a new request (HTTP/2) or a byte (HTTP/1.1). An HTTP/2 connection
 * is asked to go, as an agent would close it between heartbeats (a GOAWAY:
 * a request under way finishes; the agent connects again for its next). An HTTP/1.1 one is node:http's, which on
 * a node:http2 server has no idle timeout of its own: its socket's timeout
 * is it, and node:http destroys the socket when it fires (no one listens
 * for `timeout`).
 */
function holdConnections(server: Http2SecureServer, limits: ServerLimits, metrics: ServerMetrics | undefined): void {
  server.maxConnections = limits.connections;
  let refusing = false;
  server.on('drop', () => {
    metrics?.connectionsRefused.inc();
    if (refusing) return;
    refusing = true;
    log.server(
      'at %d open connections (its connections limit): refusing new ones until some close',
      limits.connections,
    );
  });
  server.on('connection', () => {
    refusing = false;
  });
  server.on('session', (connection: ServerHttp2Session) => {
    // Not Node's own (`Http2Session.setTimeout`), which pushes its timer back on every read and write, several
    // times a heartbeat, each a lookup in Node's timer table and a clock read: each request's start is noted (a
    // clock read), and the timer, when it fires, waits again for what is left since the last one. A request
    // under way when it closes finishes: the GOAWAY only stops new ones.
    let lastRequest = performance.now();
    const expire = () => {
      const left = lastRequest + limits.idleTimeout - performance.now();
      if (left > 0) idle = setTimeout(expire, Math.ceil(left)).unref();
      else connection.close();
    };
    let idle = setTimeout(expire, limits.idleTimeout).unref();
    connection.on('stream', () => {
      lastRequest = performance.now();
    });
    connection.once('close', () => clearTimeout(idle));
  });
  server.on('secureConnection', (socket: TLSSocket) => {
    if (socket.alpnProtocol !== 'h2') socket.setTimeout(limits.idleTimeout);
  });
}

/** Options of {@link BmaasServer.start}. */
export interface BmaasServerOptions {
  /** The BMDB heartbeats and enrollments are recorded in. */
  readonly bmdb: BMDB;
  /** Where to listen; port 0 picks a free one. */
  readonly listen: { readonly host: string; readonly port: number };
  /** The server's certificate and key (PEM). */
  readonly tls: Pick<ServerTls, 'cert' | 'key'>;
  /** Register request metrics here. */
  readonly metrics?: Registry;
  /** What clients may hold of the server (connections, streams, bytes of requests not yet answered, time); the rest default. */
  readonly limits?: Partial<ServerLimits>;
}

/**
 * The BMaaS server: AgentCallback and AgentEnrollment over gRPC (and Connect
 * and gRPC-Web) on HTTP/2 with TLS, and installed OSes' reports of their
 * first boot (`POST /phone-home/<machine ID>/<secret>`, HTTP/1.1 or
 * HTTP/2, no client certificate: the installation's secret authenticates it). It asks every client for a certificate and checks no
 * chain: an agent's is self-signed over its ed25519 key, and what
 * authenticates a heartbeat is that key being its machine's (see
 * `AgentHeartbeats.record` of `@bmaas/bmdb-model`).
 *
 * Heartbeats over gRPC with protobuf, which is how agents call, take a lean
 * path on `node:http2`'s streams (`Heartbeats.serve`, `grpc-unary.ts`);
 * everything else goes to `@connectrpc/connect-node` as it arrives
 * (`library-requests.ts`). Both answer through `Heartbeats.answer`, from the same table of service names
 * (`routes.ts`), and both hold clients to the same {@link ServerLimits}: at
 * most `connections` are open; a connection without a certificate is
 * refused before a request's body is read; a connection has at most
 * `streamsPerConnection` streams open (as HTTP/2 tells the client), and its
 * requests are held against its share and the server's of bytes buffered
 * until answered, and cut off if not answered in `requestTimeout`; a
 * connection, HTTP/2 or HTTP/1.1, idle for `idleTimeout` is closed.
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
  /** Open HTTP/2 connections (Node's `Http2Session`s): agents keep theirs between heartbeats. */
  readonly #connections = new Set<ServerHttp2Session>();
  readonly #sockets = new Set<Socket>();

  private constructor(server: Http2SecureServer) {
    this.#server = server;
    server.on('session', (connection) => {
      this.#connections.add(connection);
      connection.once('close', () => this.#connections.delete(connection));
    });
    // A connection still in its TLS handshake, or speaking HTTP/1.1, is no HTTP/2 connection yet,
    // and `close` waits for it: past the grace its socket is destroyed with the HTTP/2 connections.
    server.on('connection', (socket: Socket) => {
      this.#sockets.add(socket);
      socket.once('close', () => this.#sockets.delete(socket));
    });
  }

  /** Starts listening; resolves once it does. */
  static async start(options: BmaasServerOptions): Promise<BmaasServer> {
    const limits = serverLimits(options.limits);
    const metrics = options.metrics ? new ServerMetrics(options.metrics) : undefined;
    const budget = new RequestBudget(limits, metrics);
    const heartbeats = new Heartbeats(options.bmdb, metrics);
    const enrollments = new Enrollments(options.bmdb, metrics);
    const library = connectNodeAdapter({
      routes: libraryRoutes(heartbeats, enrollments),
      contextValues: (request) => createContextValues().set(peerKey, peerKeyOf(request)),
      // Requests may come gzipped, as on the lean path; answers are too small to be worth compressing.
      acceptCompression: [compressionGzip],
      // Upstream gRPC's default ceiling; a hardware report is a few kilobytes.
      readMaxBytes: READ_MAX_BYTES,
    });
    const phoneHome = phoneHomeHandler(options.bmdb, metrics, budget);
    const toLibrary = libraryRequests(library, heartbeats, enrollments, budget);
    const server = createSecureServer(
      {
        cert: options.tls.cert,
        key: options.tls.key,
        requestCert: true,
        rejectUnauthorized: false,
        allowHTTP1: true,
        settings: { maxConcurrentStreams: limits.streamsPerConnection },
      },
      // Installed OSes' first boot reports need no client certificate: the rest goes to the library.
      (request, response) => (isPhoneHome(request) ? phoneHome(request, response) : toLibrary(request, response)),
    );
    routeStreams(server, heartbeats, enrollments, budget);
    holdConnections(server, limits, metrics);
    // A client that breaks off its handshake or connection is its own business.
    server.on('tlsClientError', (error) => log.server('TLS handshake failed: %s', error.message));
    server.on('sessionError', (error) => log.server('HTTP/2 connection failed: %s', error.message));
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
    log.server('serving AgentCallback and AgentEnrollment at %s:%d', host, bmaas.port);
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
      for (const connection of this.#connections) connection.destroy();
      for (const socket of this.#sockets) socket.destroy();
    }, grace);
    // Idle agents keep their connections open between heartbeats: ask them to go.
    for (const connection of this.#connections) connection.close();
    await closed;
    clearTimeout(timer);
    log.server('stopped');
  }
}
