/**
 * `npm run stream-limits -w bench`: `shepherd server` (compiled, one
 * process) under clients that open streams announcing 4 MiB and never
 * finish them, from one connection and from several, with its limits off
 * (as it was before it had them) and at their defaults; meanwhile real
 * agents heartbeat, each on its own TLS connection. Prints, per run, the
 * server's resident memory and the bytes it holds of requests not yet answered
 * (their peaks), the requests it cut off, and the agents' heartbeats
 * answered and their latency (p50, p99), with the load average; writes
 * bench/results/stream-limits.{json,md}.
 *
 * A hostile stream: gRPC headers, a length prefix of 4 MiB, then 64 KiB
 * chunks as fast as the server takes them, up to 4 MiB less a byte (so it
 * is never whole); a connection keeps BENCH_LIMITS_STREAMS of them open,
 * opening another (at most one each 10 ms) as the server cuts one off. Its
 * certificate is self-signed, as any client can make one: the handshake
 * passes, the key is unknown.
 *
 * Environment: BENCH_LIMITS_AGENTS (default 50), BENCH_LIMITS_RATE (each
 * agent's heartbeats a second, default 4), BENCH_LIMITS_STREAMS (per hostile
 * connection, default 32), BENCH_LIMITS_SECONDS (of each run under load,
 * default 30), BENCH_LIMITS_RUNS (e.g. `off:1,default:1,default:8`; the
 * default runs every row of the table below).
 */

import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { type ClientHttp2Session, type ClientHttp2Stream, connect } from 'node:http2';
import { loadavg } from 'node:os';
import path from 'node:path';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import {
  type Agent,
  connectAgents,
  type Fleet,
  freePort,
  heartbeat,
  prepareFleet,
  removeFleet,
} from './heartbeat-fleet.js';
import { BenchServer } from './server.js';
import { latency } from './stats.js';

const ROOT = path.join(import.meta.dirname, '..', '..');
const RESULTS = path.join(import.meta.dirname, '..', 'results');
const AGENTS = Number(process.env.BENCH_LIMITS_AGENTS ?? 50);
const RATE = Number(process.env.BENCH_LIMITS_RATE ?? 4);
const STREAMS = Number(process.env.BENCH_LIMITS_STREAMS ?? 32);
const SECONDS = Number(process.env.BENCH_LIMITS_SECONDS ?? 30);
const ANNOUNCED = 4 * 1024 * 1024;
const CHUNK = Buffer.alloc(64 * 1024, 0x61);

/** The server's limits: none to speak of (as before it had them), or its defaults. */
type Limits = 'off' | 'default';
const LIMIT_FLAGS: Record<Limits, string[]> = {
  off: [
    '--max-streams-per-connection',
    '4294967295',
    '--max-buffered-bytes',
    '1048576GiB',
    '--max-buffered-bytes-per-connection',
    '1048576GiB',
    '--request-timeout',
    '596h',
    '--idle-timeout',
    '596h',
  ],
  default: [],
};

interface Run {
  readonly limits: Limits;
  readonly connections: number;
  /** Hostile clients present a (self-signed) certificate; without one, they are refused before their bodies are read. */
  readonly certificate: boolean;
}

const DEFAULT_RUNS: readonly Run[] = [
  { limits: 'off', connections: 0, certificate: true },
  { limits: 'off', connections: 1, certificate: true },
  { limits: 'off', connections: 8, certificate: true },
  { limits: 'off', connections: 32, certificate: true },
  { limits: 'default', connections: 0, certificate: true },
  { limits: 'default', connections: 1, certificate: true },
  { limits: 'default', connections: 8, certificate: true },
  { limits: 'default', connections: 32, certificate: true },
  { limits: 'default', connections: 8, certificate: false },
];

function runsFromEnvironment(): readonly Run[] {
  const given = process.env.BENCH_LIMITS_RUNS;
  if (given === undefined) return DEFAULT_RUNS;
  return given.split(',').map((entry) => {
    const [limits, connections, anonymous] = entry.split(':');
    if ((limits !== 'off' && limits !== 'default') || !/^\d+$/.test(connections ?? '')) {
      throw new Error(`BENCH_LIMITS_RUNS: ${JSON.stringify(entry)} is not <off|default>:<connections>[:anonymous]`);
    }
    return { limits, connections: Number(connections), certificate: anonymous !== 'anonymous' };
  });
}

export interface LimitsFigure extends Run {
  readonly streamsPerConnection: number;
  readonly seconds: number;
  /** The server's resident memory before the load, and its peak under it (MiB). */
  readonly rssBeforeMiB: number;
  readonly rssPeakMiB: number;
  /** The bytes of requests not yet answered the server held at most (MiB). */
  readonly bufferedPeakMiB: number;
  readonly cutOff: Record<string, number>;
  readonly hostileStreamsOpened: number;
  readonly heartbeatsAnswered: number;
  readonly heartbeatsFailed: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly loadAverage: number;
}

/** `shepherd server` with `flags`, its metrics on `metricsPort`; resolves once it listens. */
async function startServer(fleet: Fleet, port: number, metricsPort: number, flags: string[]): Promise<ChildProcess> {
  const server = spawn(
    process.execPath,
    [
      path.join(ROOT, 'packages/cli/bin/shepherd.js'),
      'server',
      '--bmdb-url',
      fleet.url,
      '--data-dir',
      fleet.dir,
      '--listen',
      `127.0.0.1:${port}`,
      '--metrics-listen',
      `127.0.0.1:${metricsPort}`,
      ...flags,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, DEBUG: 'shepherd:cli', DEBUG_COLORS: '0' } },
  );
  await new Promise<void>((resolve, reject) => {
    let log = '';
    server.once('exit', (code) => reject(new Error(`shepherd server exited with ${code}: ${log}`)));
    server.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      log += chunk;
      if (log.includes('listening')) resolve();
    });
  });
  return server;
}

function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) / 1024;
}

async function serverMetrics(port: number): Promise<{ buffered: number; cutOff: Record<string, number> }> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const buffered = Number(/^bmaas_server_buffered_request_bytes (\d+)/m.exec(text)?.[1] ?? 0);
  const cutOff: Record<string, number> = {};
  for (const [, limit, count] of text.matchAll(/^bmaas_server_requests_cut_off_total\{limit="(\w+)"\} (\d+)/gm)) {
    cutOff[limit as string] = Number(count);
  }
  return { buffered, cutOff };
}

/** One hostile connection keeping `streams` unfinished requests open until `stop`. */
class HostileConnection {
  readonly #session: ClientHttp2Session;
  #open = 0;
  #stopped = false;
  opened = 0;

  constructor(port: number, ca: string, certificate: boolean, streams: number) {
    const { privateKey } = generateKeyPairSync('ed25519');
    this.#session = connect(`https://localhost:${port}`, {
      ca,
      ...(certificate && {
        cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'hostile' })),
        key: privateKey.export({ type: 'pkcs8', format: 'pem' }),
      }),
    });
    this.#session.on('error', () => {});
    const refill = setInterval(() => {
      if (this.#stopped || this.#session.destroyed) return clearInterval(refill);
      if (this.#open < streams) this.#openStream();
    }, 10);
    for (let i = 0; i < streams; i++) this.#openStream();
  }

  #openStream(): void {
    let stream: ClientHttp2Stream;
    try {
      stream = this.#session.request({
        ':method': 'POST',
        ':path': '/cloud.bmaas.server.api.AgentCallback/Heartbeat',
        'content-type': 'application/grpc',
        te: 'trailers',
      });
    } catch {
      return;
    }
    this.#open++;
    this.opened++;
    stream.on('error', () => {});
    stream.on('close', () => this.#open--);
    stream.resume();
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(ANNOUNCED, 1);
    stream.write(prefix);
    let sent = 0;
    const pump = () => {
      while (!this.#stopped && !stream.closed && sent + CHUNK.length < ANNOUNCED) {
        sent += CHUNK.length;
        if (!stream.write(CHUNK)) return void stream.once('drain', pump);
      }
    };
    pump();
  }

  stop(): void {
    this.#stopped = true;
    this.#session.destroy();
  }
}

/** Agents heartbeating, each `RATE` times a second, until `stop`; their latencies in ms. */
function heartbeatOn(agents: readonly Agent[]): { stop(): Promise<{ latencies: number[]; failed: number }> } {
  const latencies: number[] = [];
  let failed = 0;
  let stopped = false;
  const loops = agents.map(async (agent, i) => {
    // Spread over the first period, so the agents do not beat in step.
    await new Promise((resolve) => setTimeout(resolve, (i * 1000) / RATE / agents.length));
    while (!stopped) {
      const started = performance.now();
      await heartbeat(agent).then(
        () => latencies.push(performance.now() - started),
        () => failed++,
      );
      const wait = 1000 / RATE - (performance.now() - started);
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    }
  });
  return {
    async stop() {
      stopped = true;
      await Promise.all(loops);
      return { latencies, failed };
    },
  };
}

async function measure(fleet: Fleet, run: Run): Promise<LimitsFigure> {
  const port = await freePort();
  const metricsPort = await freePort();
  const server = await startServer(fleet, port, metricsPort, LIMIT_FLAGS[run.limits]);
  const pid = server.pid ?? 0;
  console.error(`${run.limits}, ${run.connections} hostile connections: server pid ${pid}, metrics at ${metricsPort}`);
  const ca = await readFile(path.join(fleet.dir, 'server.crt'), 'utf8');
  const agents = await connectAgents(fleet, port);
  let hostile: HostileConnection[] = [];
  try {
    // Warm: every agent connected and answered once.
    await Promise.all(agents.map((agent) => heartbeat(agent)));
    const rssBeforeMiB = rssMiB(pid);
    const beating = heartbeatOn(agents);
    hostile = Array.from({ length: run.connections }, () => new HostileConnection(port, ca, run.certificate, STREAMS));
    let rssPeakMiB = rssBeforeMiB;
    let bufferedPeak = 0;
    const load: number[] = [];
    const until = performance.now() + SECONDS * 1000;
    while (performance.now() < until) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      rssPeakMiB = Math.max(rssPeakMiB, rssMiB(pid));
      bufferedPeak = Math.max(bufferedPeak, (await serverMetrics(metricsPort)).buffered);
      load.push(loadavg()[0] ?? 0);
    }
    const { latencies, failed } = await beating.stop();
    const { cutOff } = await serverMetrics(metricsPort);
    const { p50, p99 } = latency(latencies);
    return {
      ...run,
      streamsPerConnection: STREAMS,
      seconds: SECONDS,
      rssBeforeMiB: round(rssBeforeMiB),
      rssPeakMiB: round(rssPeakMiB),
      bufferedPeakMiB: round(bufferedPeak / 1024 / 1024),
      cutOff,
      hostileStreamsOpened: hostile.reduce((sum, connection) => sum + connection.opened, 0),
      heartbeatsAnswered: latencies.length,
      heartbeatsFailed: failed,
      p50Ms: round(p50),
      p99Ms: round(p99),
      loadAverage: round(load.reduce((a, b) => a + b, 0) / Math.max(1, load.length)),
    };
  } finally {
    for (const connection of hostile) connection.stop();
    for (const agent of agents) agent.session.destroy();
    await stopServer(server);
  }
}

/** SIGTERM, and SIGKILL if it has not exited 30 s later (said on stderr: a stop that hangs is a finding). */
async function stopServer(server: ChildProcess): Promise<void> {
  if (server.exitCode !== null || server.signalCode !== null) return;
  const exited = new Promise((resolve) => server.once('exit', resolve));
  server.kill('SIGTERM');
  const killer = setTimeout(() => {
    console.error(`shepherd server (pid ${server.pid}) still running 30 s after SIGTERM: killed`);
    server.kill('SIGKILL');
  }, 30_000);
  await exited;
  clearTimeout(killer);
}

function round(value: number): number {
  return Math.round(value * 10) / 10;
}

function render(figures: readonly LimitsFigure[]): string {
  const lines = [
    `shepherd server under unfinished requests: ${AGENTS} agents at ${RATE}/s each; hostile connections keep ${STREAMS} streams each announcing 4 MiB, never whole; ${SECONDS} s a run`,
    '',
    '| limits | hostile connections | certificate | server RSS before → peak (MiB) | held not yet answered, peak (MiB) | cut off | hostile streams opened | heartbeats answered / failed | p50 (ms) | p99 (ms) | load average |',
    '|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|',
  ];
  for (const f of figures) {
    const cut =
      Object.entries(f.cutOff)
        .map(([limit, count]) => `${limit} ${count}`)
        .join(', ') || '—';
    lines.push(
      `| ${f.limits} | ${f.connections} | ${f.certificate ? 'self-signed' : 'none'} | ${f.rssBeforeMiB} → ${f.rssPeakMiB} | ${f.bufferedPeakMiB} | ${cut} | ${f.hostileStreamsOpened} | ${f.heartbeatsAnswered} / ${f.heartbeatsFailed} | ${f.p50Ms} | ${f.p99Ms} | ${f.loadAverage} |`,
    );
  }
  return `${lines.join('\n')}\n`;
}

async function main(): Promise<void> {
  execFileSync(path.join(ROOT, 'node_modules/.bin/tsc'), ['--build'], { cwd: ROOT, stdio: 'inherit' });
  const bench = await BenchServer.start();
  const fleet = await prepareFleet(bench, AGENTS);
  const figures: LimitsFigure[] = [];
  try {
    for (const run of runsFromEnvironment()) {
      const figure = await measure(fleet, run);
      figures.push(figure);
      console.log(render([figure]).split('\n').at(-2));
    }
  } finally {
    await removeFleet(bench, fleet);
    await bench.stop();
  }
  const table = render(figures);
  console.log(`\n${table}`);
  await mkdir(RESULTS, { recursive: true });
  await writeFile(path.join(RESULTS, 'stream-limits.json'), `${JSON.stringify(figures, null, 2)}\n`);
  await writeFile(path.join(RESULTS, 'stream-limits.md'), table);
}

await main();
