/**
 * What the heartbeat benchmarks share: a BMDB with one started machine per
 * simulated agent, the server answering them (`shepherd server`, compiled,
 * as operators run it, or the floor), each agent on its own TLS connection
 * with its own ed25519 key and client certificate, and one Heartbeat call
 * made by hand over `node:http2` (the request encoded once per agent).
 */

import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { type ClientHttp2Session, connect } from 'node:http2';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { sql } from 'kysely';
import type { BenchServer } from './server.js';

/**
 * What answers the heartbeats: `shepherd server` as operators run it, or the
 * floor (heartbeat-floor-server.ts: HTTP/2 and TLS in Node, no gRPC library,
 * no database), which bounds what any Node server reaches on these cores.
 */
export type HeartbeatServer = 'shepherd' | 'floor';

export const DATABASE = 'bench_heartbeat';
const ROOT = path.join(import.meta.dirname, '..', '..');
const PATH = '/cloud.bmaas.server.api.AgentCallback/Heartbeat';

/**
 * The headers of every call, built once per fleet. Upstream's agent gives
 * every heartbeat a 10 s deadline, so its calls carry a `grpc-timeout` (a
 * server keeps a timer per call for it).
 */
function callHeaders(timeout: string) {
  return {
    ':method': 'POST',
    ':path': PATH,
    'content-type': 'application/grpc+proto',
    te: 'trailers',
    'grpc-timeout': timeout,
  };
}

interface Identity {
  readonly privateKey: KeyObject;
  readonly cert: string;
  readonly machineId: string;
}

/** The benchmark's database, its machines and their agents' keys; a directory for the server's certificate. */
export interface Fleet {
  readonly url: string;
  readonly dir: string;
  readonly identities: readonly Identity[];
}

export interface Agent {
  readonly session: ClientHttp2Session;
  readonly headers: ReturnType<typeof callHeaders>;
  /** Its HeartbeatRequest as a gRPC message (length prefix and protobuf), encoded once. */
  readonly body: Buffer;
  /** Scheduled times (performance.now()) of sends waiting for the previous answer. */
  readonly waiting: number[];
  busy: boolean;
}

/** A fresh database with `agents` machines, each with an AgentStarted tag over its agent's own key. */
export async function prepareFleet(bench: BenchServer, agents: number): Promise<Fleet> {
  const url = await bench.createDatabase(DATABASE);
  await bench.withClient(DATABASE, (client) => client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements'));
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-heartbeat-'));
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench', runtimeInfo: 'bench' });
  try {
    const keys = Array.from({ length: agents }, () => {
      const { privateKey, publicKey } = generateKeyPairSync('ed25519');
      return { privateKey, raw: Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url') };
    });
    const { rows } = await sql<{ machine_id: string }>`
      INSERT INTO machines SELECT FROM generate_series(1, ${agents}) RETURNING machine_id`.execute(bmdb.db);
    await bmdb.db
      .insertInto('machine_agent_started')
      .values(
        rows.map((row, i) => ({
          machine_id: row.machine_id,
          agent_started_at: new Date(),
          agent_public_key: keys[i]?.raw ?? Buffer.alloc(0),
        })),
      )
      .execute();
    const identities = keys.map(({ privateKey }, i) => ({
      privateKey,
      cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'bench agent' })),
      machineId: rows[i]?.machine_id ?? '',
    }));
    return { url, dir, identities };
  } finally {
    await bmdb.close();
  }
}

/** Drops the fleet's database and directory. */
export async function removeFleet(bench: BenchServer, fleet: Fleet): Promise<void> {
  await bench.dropDatabase(DATABASE);
  await rm(fleet.dir, { recursive: true, force: true });
}

export async function freePort(): Promise<number> {
  const listener = createServer();
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  const { port } = listener.address() as { port: number };
  await new Promise((resolve) => listener.close(resolve));
  return port;
}

/**
 * Starts `answeredBy` on `port` with `workers` processes and resolves once it
 * listens. `wrapper` runs it under another program (valgrind: the command
 * line goes after it).
 */
export async function startServer(
  answeredBy: HeartbeatServer,
  fleet: Fleet,
  port: number,
  workers: number,
  wrapper: readonly string[] = [],
): Promise<ChildProcess> {
  const server =
    answeredBy === 'shepherd'
      ? startShepherd(fleet, port, workers, wrapper)
      : await startFloor(fleet.dir, port, workers, wrapper);
  await new Promise<void>((resolve, reject) => {
    let log = '';
    server.once('exit', (code) => reject(new Error(`${answeredBy} server exited with ${code}: ${log}`)));
    server.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      log += chunk;
      if (log.includes('listening')) resolve();
    });
  });
  return server;
}

/** Stops a server started by {@link startServer} and waits for it to exit. */
export async function stopServer(server: ChildProcess): Promise<void> {
  if (server.exitCode !== null || server.signalCode !== null) return;
  const exited = new Promise((resolve) => server.once('exit', resolve));
  server.kill('SIGTERM');
  await exited;
}

/** `shepherd server`, compiled, in a process of its own; it makes its certificate under the fleet's directory. */
function startShepherd(fleet: Fleet, port: number, workers: number, wrapper: readonly string[]): ChildProcess {
  execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
  const [program = process.execPath, ...args] = [
    ...wrapper,
    process.execPath,
    ...profileFlags(),
    path.join(ROOT, 'packages/cli/bin/shepherd.js'),
    'server',
    '--bmdb-url',
    fleet.url,
    '--data-dir',
    fleet.dir,
    '--listen',
    `127.0.0.1:${port}`,
    '--workers',
    String(workers),
  ];
  return spawn(program, args, {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, DEBUG: 'shepherd:cli', DEBUG_COLORS: '0' },
  });
}

/** The floor server (heartbeat-floor-server.ts) with a certificate made here, where the generator looks for it. */
async function startFloor(
  dir: string,
  port: number,
  workers: number,
  wrapper: readonly string[],
): Promise<ChildProcess> {
  const { privateKey } = generateKeyPairSync('ed25519');
  const cert = path.join(dir, 'server.crt');
  const key = path.join(dir, 'server.key');
  await writeFile(
    cert,
    certificatePem(selfSignedCertificate(privateKey, { commonName: 'floor', altNames: ['localhost'] })),
  );
  await writeFile(key, privateKey.export({ type: 'pkcs8', format: 'pem' }));
  const [program = process.execPath, ...args] = [
    ...wrapper,
    process.execPath,
    '--import',
    'tsx',
    ...profileFlags(),
    path.join(import.meta.dirname, 'heartbeat-floor-server.ts'),
    cert,
    key,
    '127.0.0.1',
    String(port),
    String(workers),
  ];
  return spawn(program, args, { stdio: ['ignore', 'ignore', 'pipe'], cwd: path.join(import.meta.dirname, '..') });
}

function profileFlags(): string[] {
  return [
    // BENCH_PROF=<dir>: a CPU profile of the server process.
    ...(process.env.BENCH_PROF ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_PROF] : []),
    // BENCH_SERVER_NODE_FLAGS: Node flags of the server process, to try tunings (space-separated).
    ...(process.env.BENCH_SERVER_NODE_FLAGS?.split(' ').filter(Boolean) ?? []),
  ];
}

/**
 * Every agent of the fleet connected to `port` (each on its own TLS
 * connection), trusting the server's certificate; their calls carry
 * `grpc-timeout: <timeout>`.
 */
export async function connectAgents(fleet: Fleet, port: number, timeout = '10S'): Promise<Agent[]> {
  const ca = await readFile(path.join(fleet.dir, 'server.crt'), 'utf8');
  const headers = callHeaders(timeout);
  return fleet.identities.map((identity) => {
    const session = connect(`https://localhost:${port}`, {
      ca,
      cert: identity.cert,
      key: identity.privateKey.export({ type: 'pkcs8', format: 'pem' }),
    });
    session.on('error', () => {});
    return { session, headers, body: heartbeatBody(identity.machineId), waiting: [], busy: false };
  });
}

/** `HeartbeatRequest { machine_id }` framed as one gRPC message. */
function heartbeatBody(machineId: string): Buffer {
  const id = Buffer.from(machineId);
  const body = Buffer.alloc(5 + 2 + id.length);
  body.writeUInt32BE(2 + id.length, 1);
  body[5] = 0x0a; // field 1, length-delimited
  body[6] = id.length;
  id.copy(body, 7);
  return body;
}

/** One Heartbeat call; rejects unless the gRPC status is OK. */
export function heartbeat(agent: Agent): Promise<void> {
  return new Promise((resolve, reject) => {
    const stream = agent.session.request(agent.headers);
    let status: unknown;
    // The status comes in the trailers, or in the headers of a trailers-only answer.
    const take = (headers: Record<string, unknown>) => {
      status = headers['grpc-status'] ?? status;
    };
    stream.on('response', take);
    stream.on('trailers', take);
    stream.on('error', reject);
    stream.on('close', () => (status === '0' ? resolve() : reject(new Error(`gRPC status ${String(status)}`))));
    stream.resume();
    stream.end(agent.body);
  });
}
