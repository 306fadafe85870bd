/**
 * `npm run failover -w bench`: the BMDB failing over under load. For each
 * replication mode, a Patroni cluster of three PostgreSQL 15 nodes behind
 * HAProxy (test/support/patroni-cluster.ts, the configuration the README
 * shows), two `shepherd run dummy` of 8 workers starting agents on
 * BENCH_FAILOVER_MACHINES machines (default 1,500, 500 ms an agent start),
 * and BENCH_FAILOVER_AGENTS agents (default 200) heartbeating through the
 * library's path (`AgentHeartbeats.record`, what `shepherd server` calls)
 * from 16 callers. Once a quarter of the machines is started, the leader's
 * Patroni and PostgreSQL are SIGKILLed. Measured: the time from the kill to
 * the first claim and the first heartbeat recorded on the new primary;
 * claims and heartbeats per second in the 10 s before the kill and the 10 s
 * after they resumed; sessions expired; agent starts redone; and what the
 * failover lost of what the old primary had committed (read from it until
 * the kill), with what the shepherd then did: an agent started again because
 * its AgentStarted was lost. In asynchronous mode the leader's WAL senders
 * are stopped BENCH_FAILOVER_REPLICATION_STOPPED_MS (default 3,000) before
 * the kill, so the standbys miss its last commits (Patroni's
 * `maximum_lag_on_failover` raised to 1 GiB so that one is promoted
 * nevertheless). Prints a table, writes results/latest-failover.json
 * and .md. BENCH_FAILOVER_MODES: synchronous,asynchronous (default both).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { AgentHeartbeats, addProvided, newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import pg from 'pg';
// The cluster and the reading of committed rows are the failover test's own (test/ha).
import { CommittedRecorder, type CommittedRows, lostRows, readCommitted } from '../../test/ha/committed.js';
import { PatroniCluster } from '../../test/support/patroni-cluster.js';
import { eventually } from '../../test/support/wait.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const CLI = path.join(ROOT, 'packages/cli/bin/shepherd.js');
const MACHINES = Number(process.env.BENCH_FAILOVER_MACHINES ?? 1_500);
const AGENTS = Number(process.env.BENCH_FAILOVER_AGENTS ?? 200);
const MODES = (process.env.BENCH_FAILOVER_MODES ?? 'synchronous,asynchronous').split(',');
/** Callers of AgentHeartbeats.record, each heartbeating one agent after another. */
const HEARTBEAT_CALLERS = 16;
/** The window of the rates before the kill and after the resumption. */
const WINDOW = 10_000;
/**
 * In asynchronous mode, how long the leader's commits reach no standby
 * before it is killed (its WAL senders stopped): a standby that far behind,
 * as across a slow or cut network. On loopback a standby is otherwise under
 * a millisecond behind and the failover loses nothing to measure.
 */
const REPLICATION_STOPPED = Number(process.env.BENCH_FAILOVER_REPLICATION_STOPPED_MS ?? 3_000);
/**
 * Patroni's `maximum_lag_on_failover` in asynchronous mode: 1 GiB, so that
 * a standby missing the last seconds of WAL is promoted (Patroni's 1 MiB
 * default may leave the cluster without a primary instead).
 */
const MAXIMUM_LAG_ON_FAILOVER = 1024 * 1024 * 1024;

interface FailoverFigure {
  readonly mode: string;
  readonly machines: number;
  readonly agents: number;
  readonly killed: string;
  readonly newLeader: string;
  readonly firstClaimMs: number;
  readonly firstHeartbeatMs: number;
  readonly claimsPerSecondBefore: number;
  readonly claimsPerSecondAfter: number;
  readonly heartbeatsPerSecondBefore: number;
  readonly heartbeatsPerSecondAfter: number;
  readonly sessionsExpired: number;
  readonly agentStartsRedone: number;
  /** Agents started again although their start was recorded (committed) before the kill: their AgentStarted was lost. */
  readonly startedAgainAfterLoss: number;
  /** How long the leader's commits reached no standby before the kill (asynchronous mode), in ms. */
  readonly replicationStoppedMs: number;
  /** Rows the old primary had committed that the new one lacks, by kind. */
  readonly lost: Record<string, number>;
  /** The lost history rows by process and event. */
  readonly lostHistory: Record<string, number>;
  /** AgentStarted tags lost and still missing once every machine was started (the others were written again). */
  readonly agentStartedLostAtEnd: number;
  readonly committedBefore: Record<string, number>;
  readonly loadAverage: readonly [number, number];
}

/** Times of events, for rates over windows. */
class Timeline {
  readonly times: number[] = [];
  add(at = Date.now()): void {
    this.times.push(at);
  }
  rate(from: number, to: number): number {
    return (this.times.filter((t) => t >= from && t < to).length * 1000) / (to - from);
  }
  /** The earliest event after `at` (events are added as calls end, not in order). */
  firstAfter(at: number): number | undefined {
    let first: number | undefined;
    for (const t of this.times) if (t > at && (first === undefined || t < first)) first = t;
    return first;
  }
}

async function failover(mode: string): Promise<FailoverFigure> {
  const synchronous = mode === 'synchronous';
  const loadBefore = loadavg()[0] ?? 0;
  const cluster = await PatroniCluster.start(
    synchronous ? { synchronous } : { synchronous, maximumLagOnFailover: MAXIMUM_LAG_ON_FAILOVER },
  );
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-failover-'));
  const children: ChildProcess[] = [];
  const stop = new AbortController();
  try {
    const url = await cluster.createDatabase('bench');
    const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-heartbeats', runtimeInfo: 'bench' });
    // Agents of a provider the dummy runs do not know, started already: only their heartbeats matter.
    const setup = await bmdb.startSession({ processor: 'bench-setup' });
    const agents = await setup.transact(async (q) => {
      const made: { machineId: string; publicKey: Uint8Array }[] = [];
      for (let i = 0; i < AGENTS; i++) {
        const machineId = await newMachine(q);
        await addProvided(q, machineId, { provider: 'BenchAgents', providerId: `agent-${i}` });
        const publicKey = new Uint8Array(randomBytes(32));
        await setAgentStarted(q, machineId, { publicKey });
        made.push({ machineId, publicKey });
      }
      return made;
    });
    await setup.close();

    const heartbeats = new Timeline();
    const heartbeating = Array.from({ length: HEARTBEAT_CALLERS }, async (_, caller) => {
      for (let n = caller; !stop.signal.aborted; n += HEARTBEAT_CALLERS) {
        const agent = agents[n % agents.length];
        if (!agent) return;
        // A heartbeat counts at the time it was sent: one sent after the kill and recorded went to the new primary.
        const sent = Date.now();
        try {
          if ((await AgentHeartbeats.of(bmdb).record(agent)) === 'recorded') heartbeats.add(sent);
        } catch {
          // UNAVAILABLE, as the server answers: the agent tries again.
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
    });

    const agentLog = path.join(dir, 'agents.jsonl');
    const runs = ['a', 'b'].map((name) => {
      const child = spawn(
        process.execPath,
        [
          CLI,
          ...['run', 'dummy', '--bmdb-url', url, '--component-name', `bench-${name}`],
          ...['--dummy-capacity', String(MACHINES), '--dummy-agent-failure-rate', '0'],
          ...['--dummy-heartbeat-failure-rate', '0', '--dummy-heartbeat-interval', '10s'],
          ...['--dummy-agent-start-duration', '500ms', '--dummy-agent-start-log', agentLog],
          ...['--provisioner-max-machines', '0', '--provisioner-reservation-chunk-size', String(MACHINES)],
          ...['--provisioner-device-creation-rate', '1ms,1000', '--provisioner-reconciler-rate', '1s,1'],
          ...['--initializer-loop-parallelism', '8', '--initializer-db-query-rate', '1ms,1000'],
        ],
        {
          cwd: ROOT,
          env: { ...process.env, DEBUG: 'shepherd:*,bmdb:*,-*:detail,-bmdb:embedded', DEBUG_COLORS: '0' },
          stdio: ['ignore', 'ignore', 'pipe'],
          detached: true,
        },
      );
      let log = '';
      child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
        log += chunk;
      });
      children.push(child);
      return { child, log: () => log };
    });

    // Claims as the BMDB records them, sampled through HAProxy (the new primary's after the kill).
    const claims = new Timeline();
    const seen = new Set<string>();
    const sampling = (async () => {
      while (!stop.signal.aborted) {
        try {
          const rows = await cluster.query<{ key: string; at: number }>(
            'bench',
            `SELECT concat_ws(' ', machine_id, "timestamp") AS key, (extract(epoch FROM "timestamp") * 1000)::float8 AS at
             FROM work_history WHERE event = 'Started' AND "timestamp" > now() - interval '5 seconds'`,
          );
          for (const row of rows) {
            if (seen.has(row.key)) continue;
            seen.add(row.key);
            claims.add(row.at);
          }
        } catch {}
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    })();

    const started = async () =>
      (
        await cluster.query<{ n: number }>(
          'bench',
          `SELECT count(*)::int AS n FROM machine_agent_started s JOIN machine_provided p USING (machine_id)
           WHERE p.provider = 'Dummy'`,
        )
      )[0]?.n ?? 0;
    await eventually(
      'a quarter of the machines started',
      async () => ((await started()) >= MACHINES / 4 ? true : undefined),
      600_000,
      500,
    );

    const recorder = new CommittedRecorder(url);
    await recorder.start();
    await eventually('the committed rows read', async () => recorder.last, 30_000);
    // Asynchronous: the standbys stop receiving WAL, the load goes on committing on the leader, then it dies.
    let replicationStopped = 0;
    if (!synchronous) {
      await cluster.stopReplication();
      const stoppedAt = Date.now();
      await eventually(
        'commits read after the replication stopped',
        async () => (recorder.lastAt - stoppedAt >= REPLICATION_STOPPED ? true : undefined),
        REPLICATION_STOPPED + 60_000,
        100,
      );
      replicationStopped = Date.now() - stoppedAt;
    }
    const kill = await cluster.killLeader();
    const before = await recorder.stop();
    const newLeader = await cluster.waitForLeader({ not: kill.name, timeout: 180_000 });
    // What the new primary had when it was promoted, before the shepherd wrote anything lost again.
    const promoted = await eventually(
      'the new primary read',
      async () => readOnPrimary(url).catch(() => undefined),
      60_000,
      100,
    );
    const firstClaim = await eventually('a claim after the kill', async () => claims.firstAfter(kill.at), 180_000, 250);
    const firstHeartbeat = await eventually(
      'a heartbeat after the kill',
      async () => heartbeats.firstAfter(kill.at),
      180_000,
      250,
    );
    const resumed = Math.max(firstClaim, firstHeartbeat);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, resumed + WINDOW - Date.now())));
    await eventually(
      'every machine started',
      async () => ((await started()) >= MACHINES ? true : undefined),
      600_000,
      1_000,
    );

    const lost = lostRows(before, promoted);
    const lostAtEnd = lostRows(before, await readOnPrimary(url));
    const starts = await agentStartsPerMachine(agentLog);
    const redone = [...starts].filter(([, n]) => n > 1).map(([machine]) => machine);
    const figure: FailoverFigure = {
      mode,
      machines: MACHINES,
      agents: AGENTS,
      killed: kill.name,
      newLeader,
      firstClaimMs: firstClaim - kill.at,
      firstHeartbeatMs: firstHeartbeat - kill.at,
      claimsPerSecondBefore: claims.rate(kill.at - WINDOW, kill.at),
      claimsPerSecondAfter: claims.rate(firstClaim, firstClaim + WINDOW),
      heartbeatsPerSecondBefore: heartbeats.rate(kill.at - WINDOW, kill.at),
      heartbeatsPerSecondAfter: heartbeats.rate(firstHeartbeat, firstHeartbeat + WINDOW),
      sessionsExpired: runs.reduce((sum, r) => sum + (r.log().match(/ expired: /g)?.length ?? 0), 0),
      agentStartsRedone: redone.length,
      startedAgainAfterLoss: redone.filter((machine) => before.agentStarted.has(machine)).length,
      replicationStoppedMs: replicationStopped,
      lost: Object.fromEntries(Object.entries(lost).map(([kind, rows]) => [kind, rows.length])),
      lostHistory: byProcessAndEvent(lost.history ?? []),
      agentStartedLostAtEnd: lostAtEnd.agentStarted?.length ?? 0,
      committedBefore: counts(before),
      loadAverage: [loadBefore, loadavg()[0] ?? 0],
    };
    await bmdb.close().catch(() => {});
    stop.abort();
    await Promise.all([...heartbeating, sampling]);
    return figure;
  } finally {
    stop.abort();
    for (const child of children) {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {}
    }
    await cluster.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** History keys (machine, process, event, time) counted by process and event. */
function byProcessAndEvent(keys: readonly string[]): Record<string, number> {
  const counted: Record<string, number> = {};
  for (const key of keys) {
    const [, process, event] = key.split(' ');
    const kind = `${process} ${event}`;
    counted[kind] = (counted[kind] ?? 0) + 1;
  }
  return counted;
}

function counts(rows: CommittedRows): Record<string, number> {
  return {
    history: rows.history.size,
    agentStarted: rows.agentStarted.size,
    heartbeats: rows.heartbeats.size,
  };
}

async function readOnPrimary(url: string): Promise<CommittedRows> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await readCommitted(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/** Agent starts begun per machine, from the dummy agents' own record. */
async function agentStartsPerMachine(file: string): Promise<Map<string, number>> {
  const perMachine = new Map<string, number>();
  for (const line of (await readFile(file, 'utf8')).split('\n')) {
    try {
      const entry = JSON.parse(line) as { phase: string; machine: string };
      if (entry.phase === 'begin') perMachine.set(entry.machine, (perMachine.get(entry.machine) ?? 0) + 1);
    } catch {}
  }
  return perMachine;
}

function render(figures: readonly FailoverFigure[]): string {
  const n = (value: number) => value.toLocaleString('en-US', { maximumFractionDigits: 1 });
  const rows = figures.map(
    (f) =>
      `| ${f.mode} | ${n(f.firstClaimMs / 1000)} s | ${n(f.firstHeartbeatMs / 1000)} s | ${n(f.claimsPerSecondBefore)} → ${n(f.claimsPerSecondAfter)} | ` +
      `${n(f.heartbeatsPerSecondBefore)} → ${n(f.heartbeatsPerSecondAfter)} | ${f.sessionsExpired} | ${f.agentStartsRedone} | ` +
      `${f.lost.history ?? 0} of ${f.committedBefore.history}; ${f.lost.agentStarted ?? 0} of ${f.committedBefore.agentStarted}; ${f.lost.heartbeats ?? 0} of ${f.committedBefore.heartbeats} | ` +
      `${f.startedAgainAfterLoss} | ${n(f.loadAverage[0])} → ${n(f.loadAverage[1])} |`,
  );
  const losses = figures
    .filter((f) => Object.keys(f.lostHistory).length > 0)
    .map(
      (f) =>
        `- ${f.mode}, the standbys ${n(f.replicationStoppedMs / 1000)} s behind at the kill: history rows lost ${Object.entries(
          f.lostHistory,
        )
          .map(([kind, count]) => `${kind} ${count}`)
          .join(
            ', ',
          )}; AgentStarted tags lost ${f.lost.agentStarted ?? 0}, of which ${f.agentStartedLostAtEnd} still missing once every machine was started`,
    );
  return [
    `**Failover**: a 3-node Patroni cluster (ttl 30 s, loop_wait 10 s) behind HAProxy on loopback, the leader's Patroni and PostgreSQL SIGKILLed once a quarter of ${n(figures[0]?.machines ?? 0)} machines had their agents started by two \`shepherd run dummy\` of 8 workers (500 ms a start), while ${n(figures[0]?.agents ?? 0)} agents heartbeat through \`AgentHeartbeats.record\` from ${HEARTBEAT_CALLERS} callers. Rates over 10 s before the kill and 10 s after they resumed. Lost: rows the old primary had committed (read from it until the kill) that the new one lacked when it was promoted (history rows; AgentStarted tags; heartbeats moved back).`,
    '',
    '| replication | kill → first claim | kill → first heartbeat | claims/s before → after | heartbeats/s before → after | sessions expired | agent starts redone | lost (history; AgentStarted; heartbeats) | agents started again after a lost AgentStarted | load average before → after |',
    '|---|---:|---:|---|---|---:|---:|---|---:|---|',
    ...rows,
    '',
    ...(losses.length > 0 ? [...losses, ''] : []),
  ].join('\n');
}

const figures: FailoverFigure[] = [];
for (const mode of MODES) {
  console.error(`failover bench: ${mode} replication`);
  figures.push(await failover(mode));
}
const markdown = render(figures);
console.log(markdown);
const results = fileURLToPath(new URL('../results/', import.meta.url));
await writeFile(path.join(results, 'latest-failover.json'), `${JSON.stringify(figures, null, 2)}\n`);
await writeFile(path.join(results, 'latest-failover.md'), markdown);
