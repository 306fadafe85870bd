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
import { readdir, readFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import {
  type Agent,
  connectAgents,
  DATABASE,
  freePort,
  type HeartbeatServer,
  heartbeat,
  prepareFleet,
  removeFleet,
  startServer,
  stopServer,
} from './heartbeat-fleet.js';
import type { BenchServer } from './server.js';
import { type Latency, latency, percentile } from './stats.js';

export type { HeartbeatServer };

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

/** Unmeasured load at the lowest rate before the first measurement. */
const WARM_UP_SECONDS = 3;

/** Starts `agents` agents and the server, offers each rate for `seconds`, and measures. */
export async function heartbeats(
  bench: BenchServer,
  agents: number,
  workers: number,
  offeredRates: readonly number[],
  seconds: number,
  answeredBy: HeartbeatServer = 'shepherd',
): Promise<HeartbeatFigure[]> {
  const fleet = await prepareFleet(bench, agents);
  const port = await freePort();
  let connected: Agent[] = [];
  const server = await startServer(answeredBy, fleet, port, workers).catch(async (error: unknown) => {
    await removeFleet(bench, fleet);
    throw error;
  });
  try {
    connected = await connectAgents(fleet, port);
    // Every connection up and authenticated once before measuring.
    await Promise.all(connected.map((agent) => heartbeat(agent)));
    // And the server's code warm (compiled, its heap grown): the first rate measured must not pay for it.
    await offer(connected, Math.min(...offeredRates), WARM_UP_SECONDS);

    const figures: HeartbeatFigure[] = [];
    for (const offered of offeredRates) {
      await bench.withClient(DATABASE, (client) => client.query('SELECT pg_stat_statements_reset()'));
      const before = {
        server: await processTreeSeconds(server.pid ?? 0),
        generator: process.cpuUsage(),
        postgres: await postgresSeconds(),
      };
      const measured = await offer(connected, offered, seconds);
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
    for (const agent of connected) agent.session.destroy();
    await stopServer(server);
    await removeFleet(bench, fleet);
  }
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
