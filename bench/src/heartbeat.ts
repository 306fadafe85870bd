/**
 * Heartbeats through the BMaaS server: simulated agents, each on its own
 * TLS connection with its own ed25519 key and client certificate, against
 * one `shepherd server` process (compiled, as operators run it) recording
 * into the BMDB. Each agent sends on a schedule (open loop, staggered), so
 * the offered rate is `agents / interval`; latency is from a heartbeat's send to its answer.
 * Statements per heartbeat come from pg_stat_statements: calls of the
 * heartbeat statement over heartbeats answered.
 */
import { execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { type ClientHttp2Session, connect } from 'node:http2';
import { createServer } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { certificatePem, selfSignedCertificate } from '@bmaas/server';
import { sql } from 'kysely';
import type { BenchServer } from './server.js';
import { type Latency, latency } from './stats.js';

export interface HeartbeatFigure {
  readonly agents: number;
  /** Heartbeats offered per second (every agent once per interval). */
  readonly offered: number;
  /** Heartbeats answered OK per second. */
  readonly perSecond: number;
  readonly latency: Latency;
  readonly statementsPerHeartbeat: number;
  readonly failed: number;
  /** CPU seconds per second of the measurement: server process, load generator, PostgreSQL (all its processes). */
  readonly cpu: { readonly server: number; readonly generator: number; readonly postgres: number };
  /** The machine's 1-minute load average at the end: other work on a shared machine shows here. */
  readonly loadAverage: number;
}

async function freePort(): Promise<number> {
  const listener = createServer();
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  const { port } = listener.address() as { port: number };
  await new Promise((resolve) => listener.close(resolve));
  return port;
}

/** CPU seconds used so far by `pid` (utime + stime), from /proc. */
async function cpuSeconds(pid: number): Promise<number> {
  try {
    const fields = (await readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]?.split(' ') ?? [];
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

/**
 * CPU seconds used so far by each PostgreSQL backend serving the benchmark's
 * database, by pid (its command line names the database; the machine's other
 * PostgreSQL servers do not count).
 */
async function postgresSeconds(): Promise<Map<number, number>> {
  const seconds = new Map<number, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if ((await readFile(`/proc/${entry}/cmdline`, 'utf8')).startsWith(`postgres: bmdb ${DATABASE} `)) {
        seconds.set(Number(entry), await cpuSeconds(Number(entry)));
      }
    } catch {}
  }
  return seconds;
}

/** CPU seconds PostgreSQL used between two readings, over the processes alive at both. */
function postgresDelta(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0;
  for (const [pid, seconds] of after) total += seconds - (before.get(pid) ?? seconds);
  return total;
}

const DATABASE = 'bench_heartbeat';
const ROOT = path.join(import.meta.dirname, '..', '..');
const PATH = '/cloud.bmaas.server.api.AgentCallback/Heartbeat';

interface Agent {
  readonly machineId: string;
  readonly session: ClientHttp2Session;
}

/** Starts `agents` agents and the server, offers each rate for `seconds`, and measures. */
export async function heartbeats(
  bench: BenchServer,
  agents: number,
  offeredRates: readonly number[],
  seconds: number,
): Promise<HeartbeatFigure[]> {
  const url = await bench.createDatabase(DATABASE);
  await bench.withClient(DATABASE, (client) => client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements'));
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-heartbeat-'));
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench', runtimeInfo: 'bench' });
  const identities = Array.from({ length: agents }, () => {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    return {
      privateKey,
      raw: Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url'),
      cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'bench agent' })),
    };
  });
  const { rows } = await sql<{ machine_id: string }>`
    INSERT INTO machines SELECT FROM generate_series(1, ${agents}) RETURNING machine_id`.execute(bmdb.db);
  await bmdb.db
    .insertInto('machine_agent_started')
    .values(
      rows.map((row, i) => ({
        machine_id: row.machine_id,
        agent_started_at: new Date(),
        agent_public_key: identities[i]?.raw ?? Buffer.alloc(0),
      })),
    )
    .execute();
  await bmdb.close();

  // The server as operators run it: `shepherd server`, compiled, in a process of its own.
  execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
  const port = await freePort();
  const server = spawn(
    process.execPath,
    [
      // BENCH_PROF=<dir>: a CPU profile of the server process.
      ...(process.env.BENCH_PROF ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_PROF] : []),
      path.join(ROOT, 'packages/cli/bin/shepherd.js'),
      'server',
      '--bmdb-url',
      url,
      '--data-dir',
      dir,
      '--listen',
      `127.0.0.1:${port}`,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, DEBUG: 'shepherd:cli', DEBUG_COLORS: '0' } },
  );
  const sessions: ClientHttp2Session[] = [];
  try {
    await new Promise<void>((resolve, reject) => {
      let log = '';
      server.once('exit', (code) => reject(new Error(`shepherd server exited with ${code}: ${log}`)));
      server.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
        log += chunk;
        if (log.includes('BMaaS server listening')) resolve();
      });
    });
    const ca = await readFile(path.join(dir, 'server.crt'), 'utf8');
    const fleet: Agent[] = [];
    for (const [i, identity] of identities.entries()) {
      const session = connect(`https://localhost:${port}`, {
        ca,
        cert: identity.cert,
        key: identity.privateKey.export({ type: 'pkcs8', format: 'pem' }),
      });
      session.on('error', () => {});
      sessions.push(session);
      fleet.push({ machineId: rows[i]?.machine_id ?? '', session });
    }
    // Every connection up and authenticated once before measuring.
    await Promise.all(fleet.map((agent) => heartbeat(agent)));

    const figures: HeartbeatFigure[] = [];
    for (const offered of offeredRates) {
      await bench.withClient(DATABASE, (client) => client.query('SELECT pg_stat_statements_reset()'));
      const before = {
        server: await cpuSeconds(server.pid ?? 0),
        generator: process.cpuUsage(),
        postgres: await postgresSeconds(),
      };
      const measured = await offer(fleet, offered, seconds);
      const generator = process.cpuUsage(before.generator);
      const cpu = {
        server: ((await cpuSeconds(server.pid ?? 0)) - before.server) / seconds,
        generator: (generator.user + generator.system) / 1e6 / seconds,
        postgres: postgresDelta(before.postgres, await postgresSeconds()) / seconds,
      };
      const calls = await bench.withClient(DATABASE, async (client) => {
        const result = await client.query<{ calls: string }>(
          "SELECT coalesce(sum(calls), 0) AS calls FROM pg_stat_statements WHERE query LIKE '%INSERT INTO machine_hardware_report%'",
        );
        return Number(result.rows[0]?.calls ?? 0);
      });
      figures.push({
        agents,
        offered,
        perSecond: measured.ok / seconds,
        latency: latency(measured.latencies),
        statementsPerHeartbeat: calls / Math.max(1, measured.ok),
        failed: measured.failed,
        cpu,
        loadAverage: loadavg()[0] ?? 0,
      });
    }
    return figures;
  } finally {
    for (const session of sessions) session.destroy();
    server.kill('SIGTERM');
    await new Promise((resolve) => server.once('exit', resolve));
    await bench.dropDatabase(DATABASE);
    await rm(dir, { recursive: true, force: true });
  }
}

/** Each agent heartbeats every `agents / offered` seconds, staggered, for `seconds`. */
async function offer(
  fleet: readonly Agent[],
  offered: number,
  seconds: number,
): Promise<{ ok: number; failed: number; latencies: number[] }> {
  const interval = (fleet.length / offered) * 1000;
  const end = performance.now() + seconds * 1000;
  const latencies: number[] = [];
  let ok = 0;
  let failed = 0;
  await Promise.all(
    fleet.map(async (agent, i) => {
      let next = performance.now() + (interval * i) / fleet.length;
      for (;;) {
        const wait = next - performance.now();
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
        if (performance.now() >= end) return;
        const sent = performance.now();
        try {
          await heartbeat(agent);
          ok++;
          latencies.push(performance.now() - sent);
        } catch {
          failed++;
        }
        next += interval;
      }
    }),
  );
  return { ok, failed, latencies };
}

/** One Heartbeat call; rejects unless the gRPC status is OK. */
function heartbeat(agent: Agent): Promise<void> {
  return new Promise((resolve, reject) => {
    const stream = agent.session.request({
      ':method': 'POST',
      ':path': PATH,
      'content-type': 'application/grpc+proto',
      te: 'trailers',
    });
    let status: string | undefined;
    const take = (headers: Record<string, unknown>) => {
      if (headers['grpc-status'] !== undefined) status = String(headers['grpc-status']);
    };
    stream.on('response', take);
    stream.on('trailers', take);
    stream.on('data', () => {});
    stream.on('error', reject);
    stream.on('close', () => (status === '0' ? resolve() : reject(new Error(`gRPC status ${status}`))));
    const id = Buffer.from(agent.machineId);
    const message = Buffer.concat([Buffer.from([0x0a, id.length]), id]);
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(message.length, 1);
    stream.end(Buffer.concat([prefix, message]));
  });
}
