/**
 * The floor under the heartbeat figures: the least a Node server can do per
 * heartbeat on this machine. It speaks just enough gRPC for the benchmark's
 * generator (one message in, an empty HeartbeatResponse and `grpc-status: 0`
 * out) over `node:http2` with TLS, asks for and reads each connection's
 * client key as `shepherd server` does, and records nothing: no gRPC
 * library, no BMDB. What it costs is what any Node server pays for HTTP/2
 * and TLS, so its figures bound what `shepherd server` could reach with the
 * generator on the same cores. Never a server to run: it checks no key.
 *
 *   node --import tsx heartbeat-floor-server.ts CERT KEY HOST PORT WORKERS
 */
import cluster from 'node:cluster';
import { readFileSync } from 'node:fs';
import { constants, createSecureServer, type ServerHttp2Stream } from 'node:http2';
import type { TLSSocket } from 'node:tls';

const [certPath, keyPath, host, port, workers] = process.argv.slice(2);
if (!certPath || !keyPath || !host || !port || !workers) {
  throw new Error(
    `usage: heartbeat-floor-server.ts CERT KEY HOST PORT WORKERS (got ${process.argv.slice(2).join(' ')})`,
  );
}

/** An empty HeartbeatResponse as one gRPC message: no compression, length 0. */
const EMPTY_MESSAGE = Buffer.alloc(5);
const RESPONSE_HEADERS = { [constants.HTTP2_HEADER_STATUS]: 200, 'content-type': 'application/grpc+proto' };
const TRAILERS = { 'grpc-status': '0' };

/** Each connection's client key, read once, as `shepherd server` reads it. */
const keys = new WeakMap<TLSSocket, string | undefined>();

function clientKey(socket: TLSSocket): string | undefined {
  if (!keys.has(socket)) keys.set(socket, socket.getPeerX509Certificate()?.publicKey.export({ format: 'jwk' }).x);
  return keys.get(socket);
}

function answer(stream: ServerHttp2Stream): void {
  const socket = stream.session?.socket as TLSSocket | undefined;
  if (socket === undefined || clientKey(socket) === undefined) {
    stream.respond({ ...RESPONSE_HEADERS, 'grpc-status': '16' }, { endStream: true });
    return;
  }
  // The request's one message is read and dropped: the generator sends what shepherd server would parse.
  stream.on('data', () => {});
  stream.on('end', () => {
    stream.respond(RESPONSE_HEADERS, { waitForTrailers: true });
    stream.once('wantTrailers', () => stream.sendTrailers(TRAILERS));
    stream.end(EMPTY_MESSAGE);
  });
}

if (cluster.isPrimary && Number(workers) > 1) {
  for (let i = 0; i < Number(workers); i++) cluster.fork();
  let listening = 0;
  cluster.on('listening', () => {
    if (++listening === Number(workers)) process.stderr.write('floor server listening\n');
  });
  process.on('SIGTERM', () => {
    for (const worker of Object.values(cluster.workers ?? {})) worker?.kill('SIGTERM');
    process.exit(0);
  });
} else {
  const server = createSecureServer({
    cert: readFileSync(certPath),
    key: readFileSync(keyPath),
    requestCert: true,
    rejectUnauthorized: false,
  });
  server.on('stream', answer);
  server.on('sessionError', () => {});
  server.listen(Number(port), host, () => {
    if (cluster.isPrimary) process.stderr.write('floor server listening\n');
  });
  process.on('SIGTERM', () => process.exit(0));
}
