/**
 * Heartbeats through the BMaaS server: simulated agents, each on its own
 * TLS connection with its own ed25519 key and client certificate, against
 * `shepherd server` (compiled, as operators run it; `--workers` processes)
 * recording into the BMDB. The offered load is an open-loop schedule: send
 * k is due at `k / offered` s and goes to agent `k mod agents`, so every
 * agent heartbeats every `agents / offered` s. A send is never skipped or
 * re-timed because the server is slow: an agent whose previous heartbeat is
 * still unanswered sends the next one as soon as it is, and every latency is
 * from the scheduled send time to the answer (no coordinated omission).
 * Sends still waiting when the measurement ends count as missed, with the
 * time they had waited as their latency (a lower bound).
 * Statements per heartbeat come from pg_stat_statements: calls of the
 * heartbeat statement over heartbeats answered.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { type ClientHttp2Session, connect } from 'node:http2';
import { createServer } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { certificatePem, selfSignedCertificate } from '@bmaas/server';
import { sql } from 'kysely';
import type { BenchServer } from './server.js';
import { type Latency, latency, percentile } from './stats.js';

/**
 * What answers the heartbeats: `shepherd server` as operators run it, or the
 * floor (heartbeat-floor-server.ts: HTTP/2 and TLS in Node, no gRPC library,
 * no database), which bounds what any Node server reaches on these cores.
 */
export type HeartbeatServer = 'shepherd' | 'floor';

export interface HeartbeatFigure {
  readonly server: HeartbeatServer;
  readonly agents: number;
  /** Server processes (`shepherd server --workers`). */
  readonly workers: number;
  /** Heartbeats offered per second (every agent once per interval). */
  readonly offered: number;
  /** Heartbeats answered OK per second. */
  readonly perSecond: number;
  readonly latency: Latency;
  readonly statementsPerHeartbeat: number;
  readonly failed: number;
  /** Sends due in the measurement but still waiting for their agent's previous answer at its end. */
  readonly missed: number;
  /** How late the generator's own schedule ran (99th percentile, ms): its share of the latency. */
  readonly scheduleLagP99: number;
  /** CPU seconds per second of the measurement: server processes, load generator, PostgreSQL (the benchmark's backends). */
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

/** CPU seconds used so far by `pid` and its children (the server's workers). */
async function processTreeSeconds(pid: number): Promise<number> {
  let total = await cpuSeconds(pid);
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const fields = (await readFile(`/proc/${entry}/stat`, 'utf8')).split(') ')[1]?.split(' ') ?? [];
      if (Number(fields[1]) === pid) total += await cpuSeconds(Number(entry));
    } catch {}
  }
  return total;
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
/** Unmeasured load at the lowest rate before the first measurement. */
const WARM_UP_SECONDS = 3;
const ROOT = path.join(import.meta.dirname, '..', '..');
const PATH = '/cloud.bmaas.server.api.AgentCallback/Heartbeat';

/** The same headers for every call: nothing to build per heartbeat. */
const HEADERS = {
  ':method': 'POST',
  ':path': PATH,
  'content-type': 'application/grpc+proto',
  te: 'trailers',
} as const;

interface Agent {
  readonly session: ClientHttp2Session;
  /** Its HeartbeatRequest as a gRPC message (length prefix and protobuf), encoded once. */
  readonly body: Buffer;
  /** Scheduled times (performance.now()) of sends waiting for the previous answer. */
  readonly waiting: number[];
  busy: boolean;
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

/** Starts `agents` agents and the server, offers each rate for `seconds`, and measures. */
export async function heartbeats(
  bench: BenchServer,
  agents: number,
  workers: number,
  offeredRates: readonly number[],
  seconds: number,
  answeredBy: HeartbeatServer = 'shepherd',
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

  const port = await freePort();
  const server =
    answeredBy === 'shepherd' ? await startShepherd(url, dir, port, workers) : await startFloor(dir, port, workers);
  const sessions: ClientHttp2Session[] = [];
  try {
    await new Promise<void>((resolve, reject) => {
      let log = '';
      server.once('exit', (code) => reject(new Error(`${answeredBy} server exited with ${code}: ${log}`)));
      server.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
        log += chunk;
        if (log.includes('listening')) resolve();
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
      fleet.push({ session, body: heartbeatBody(rows[i]?.machine_id ?? ''), waiting: [], busy: false });
    }
    // Every connection up and authenticated once before measuring.
    await Promise.all(fleet.map((agent) => heartbeat(agent)));
    // And the server's code warm (compiled, its heap grown): the first rate measured must not pay for it.
    await offer(fleet, Math.min(...offeredRates), WARM_UP_SECONDS);

    const figures: HeartbeatFigure[] = [];
    for (const offered of offeredRates) {
      await bench.withClient(DATABASE, (client) => client.query('SELECT pg_stat_statements_reset()'));
      const before = {
        server: await processTreeSeconds(server.pid ?? 0),
        generator: process.cpuUsage(),
        postgres: await postgresSeconds(),
      };
      const measured = await offer(fleet, offered, seconds);
      const generator = process.cpuUsage(before.generator);
      const cpu = {
        server: ((await processTreeSeconds(server.pid ?? 0)) - before.server) / seconds,
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
        server: answeredBy,
        agents,
        workers,
        offered,
        perSecond: measured.ok / seconds,
        latency: latency(measured.latencies),
        statementsPerHeartbeat: calls / Math.max(1, measured.ok),
        failed: measured.failed,
        missed: measured.missed,
        scheduleLagP99: measured.scheduleLagP99,
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

/** `shepherd server`, compiled, in a process of its own; it makes its certificate under `dir`. */
function startShepherd(url: string, dir: string, port: number, workers: number): ChildProcess {
  execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
  return spawn(
    process.execPath,
    [
      ...profileFlags(),
      path.join(ROOT, 'packages/cli/bin/shepherd.js'),
      'server',
      '--bmdb-url',
      url,
      '--data-dir',
      dir,
      '--listen',
      `127.0.0.1:${port}`,
      '--workers',
      String(workers),
    ],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, DEBUG: 'shepherd:cli', DEBUG_COLORS: '0' } },
  );
}

/** The floor server (heartbeat-floor-server.ts) with a certificate made here, where the generator looks for it. */
async function startFloor(dir: string, port: number, workers: number): Promise<ChildProcess> {
  const { privateKey } = generateKeyPairSync('ed25519');
  const cert = path.join(dir, 'server.crt');
  const key = path.join(dir, 'server.key');
  await writeFile(
    cert,
    certificatePem(selfSignedCertificate(privateKey, { commonName: 'floor', altNames: ['localhost'] })),
  );
  await writeFile(key, privateKey.export({ type: 'pkcs8', format: 'pem' }));
  return spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      ...profileFlags(),
      path.join(import.meta.dirname, 'heartbeat-floor-server.ts'),
      cert,
      key,
      '127.0.0.1',
      String(port),
      String(workers),
    ],
    { stdio: ['ignore', 'ignore', 'pipe'], cwd: path.join(import.meta.dirname, '..') },
  );
}

function profileFlags(): string[] {
  return [
    // BENCH_PROF=<dir>: a CPU profile of the server process.
    ...(process.env.BENCH_PROF ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_PROF] : []),
    // BENCH_SERVER_NODE_FLAGS: Node flags of the server process, to try tunings (space-separated).
    ...(process.env.BENCH_SERVER_NODE_FLAGS?.split(' ').filter(Boolean) ?? []),
  ];
}

interface Measured {
  ok: number;
  failed: number;
  missed: number;
  scheduleLagP99: number;
  latencies: number[];
}

/**
 * Offers `offered` heartbeats a second for `seconds` (see the module's
 * comment), from one timer that sends whatever is due, then waits for the
 * heartbeats in flight (at most 10 s). Heartbeats answered after the
 * measurement count in the latencies, not in the rate.
 */
async function offer(fleet: readonly Agent[], offered: number, seconds: number): Promise<Measured> {
  const measured: Measured = { ok: 0, failed: 0, missed: 0, scheduleLagP99: 0, latencies: [] };
  const lags: number[] = [];
  const start = performance.now();
  const end = start + seconds * 1000;
  const total = Math.floor(offered * seconds);
  let inFlight = 0;
  let drained: () => void = () => {};

  const send = (agent: Agent, scheduled: number) => {
    agent.busy = true;
    inFlight++;
    const answered = (ok: boolean) => {
      const now = performance.now();
      inFlight--;
      agent.busy = false;
      if (ok) {
        if (now <= end) measured.ok++;
        measured.latencies.push(now - scheduled);
      } else {
        measured.failed++;
      }
      const next = agent.waiting.shift();
      if (next !== undefined && now < end) send(agent, next);
      else if (inFlight === 0 && now >= end) drained();
    };
    heartbeat(agent).then(
      () => answered(true),
      () => answered(false),
    );
  };

  let k = 0;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      for (; k < total; k++) {
        const scheduled = start + (k * 1000) / offered;
        if (scheduled > now) break;
        lags.push(now - scheduled);
        const agent = fleet[k % fleet.length] as Agent;
        if (agent.busy) agent.waiting.push(scheduled);
        else send(agent, scheduled);
      }
      if (k < total) setTimeout(tick, Math.max(0, start + (k * 1000) / offered - performance.now()));
      else setTimeout(resolve, Math.max(0, end - performance.now()));
    };
    tick();
  });
  // Sends still waiting were due but never went: count them, with what they waited so far.
  const now = performance.now();
  for (const agent of fleet) {
    for (const scheduled of agent.waiting.splice(0)) {
      measured.missed++;
      measured.latencies.push(now - scheduled);
    }
  }
  if (inFlight > 0) {
    await new Promise<void>((resolve) => {
      drained = resolve;
      setTimeout(resolve, 10_000);
    });
  }
  measured.scheduleLagP99 = lags.length ? percentile(lags, 99) : 0;
  return measured;
}

/** One Heartbeat call; rejects unless the gRPC status is OK. */
function heartbeat(agent: Agent): Promise<void> {
  return new Promise((resolve, reject) => {
    const stream = agent.session.request(HEADERS);
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
