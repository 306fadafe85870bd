/**
 * Where a lone worker's time goes, per work item: the throughput benchmark's
 * `bmdb-controlloop` loop at parallelism 1, with every query the pg clients
 * send timed from the client (round trips) and pg_stat_statements on the
 * server (statements, execution and planning time). Node time is what is
 * left of an item's wall time once its round trips are taken out. CPU time
 * per item, of the PostgreSQL backends (from /proc) and of this process, is
 * measured after a warm-up: the backends' CPU beyond pg_stat_statements'
 * figure is their work outside the executor (bind, executor start and end,
 * commit, the protocol).
 *
 *   npm run breakdown -w bench     (BENCH_ITEMS, default 3,000; BENCH_CONCURRENCY, default 1)
 */
import { performance } from 'node:perf_hooks';
import { BMDB, type ControlLoop, parseLimiter, runControlLoop } from '@bmaas/bmdb-controlloop';
import { agentStartSelection, Process, type ProvidedMachine } from '@bmaas/bmdb-model';
import pg from 'pg';
import { fillFleet, PROVIDER } from './fleet.js';
import { BenchServer } from './server.js';
import { UNBOUND_LIMITER } from './throughput.js';

const ITEMS = Number(process.env.BENCH_ITEMS ?? 3_000);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 1);
const PUBLIC_KEY = new Uint8Array(32);
/** Items before CPU time is counted: sessions and prepared statements exist by then. */
const WARMUP = Math.min(200, Math.floor(ITEMS / 10));

/** CPU time so far (ms): this process, and the backends of the database by PID. */
interface CpuSnapshot {
  readonly at: number;
  readonly node: number;
  readonly backends: Map<number, number>;
}

/**
 * Client-side round trips: every `Client.query` from its call to its answer,
 * in total and by statement kind, and the wall time during which at least
 * one was in flight (a worker's end and its next claim overlap).
 */
const roundTrips = {
  count: 0,
  ms: 0,
  enabled: false,
  inFlight: 0,
  busySince: 0,
  busyMs: 0,
  byKind: new Map<string, { count: number; ms: number; all: number[] }>(),
};
type QueryFn = (...args: unknown[]) => unknown;
const original = pg.Client.prototype.query as unknown as QueryFn;
/** The kind of a statement by its text: claim, end or other. */
function kindOf(text: unknown): string {
  if (typeof text !== 'string') return 'other';
  if (text.includes('INSERT INTO work (')) return 'claim';
  if (text.includes('DELETE FROM work w')) return 'end';
  return 'other';
}
(pg.Client.prototype as unknown as { query: QueryFn }).query = function timedQuery(
  this: pg.Client,
  ...args: unknown[]
) {
  if (!roundTrips.enabled) return original.apply(this, args);
  const start = performance.now();
  if (roundTrips.inFlight++ === 0) roundTrips.busySince = start;
  const first = args[0] as { text?: unknown } | string | undefined;
  const kind = kindOf(typeof first === 'string' ? first : first?.text);
  const done = () => {
    const now = performance.now();
    roundTrips.count++;
    roundTrips.ms += now - start;
    const byKind = roundTrips.byKind.get(kind) ?? { count: 0, ms: 0, all: [] };
    byKind.count++;
    byKind.ms += now - start;
    byKind.all.push(now - start);
    roundTrips.byKind.set(kind, byKind);
    if (--roundTrips.inFlight === 0) roundTrips.busyMs += now - roundTrips.busySince;
  };
  const query = args[0] as { submit?: unknown; callback?: QueryFn } | undefined;
  if (typeof query?.submit === 'function' && typeof query.callback === 'function') {
    // A query object of the library's own (prepared statements): timed through its callback.
    const callback = query.callback;
    query.callback = (...results: unknown[]) => {
      done();
      return callback.apply(query, results);
    };
    return original.apply(this, args);
  }
  const last = args.length - 1;
  const callback = args[last];
  if (typeof callback === 'function') {
    args[last] = (...results: unknown[]) => {
      done();
      return (callback as QueryFn)(...results);
    };
    return original.apply(this, args);
  }
  const result = original.apply(this, args);
  if (result instanceof Promise) return result.finally(done);
  return result;
};

interface StatementRow {
  query: string;
  calls: string;
  exec_ms: number;
  plan_ms: number;
}

async function main(): Promise<void> {
  const server = await BenchServer.start();
  const name = 'bench_breakdown';
  try {
    const url = await server.createDatabase(name);
    const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench', runtimeInfo: 'breakdown' });
    await server.withClient(name, (client) => fillFleet(client, { total: ITEMS, ready: ITEMS, held: 0 }));
    await server.withClient('postgres', (client) => client.query('SELECT pg_stat_statements_reset()'));
    const stop = new AbortController();
    let done = 0;
    let elapsed = 0;
    const snapshot = (): CpuSnapshot => {
      const usage = process.cpuUsage();
      return { at: performance.now(), node: (usage.user + usage.system) / 1000, backends: server.backendCpu(name) };
    };
    let warm: CpuSnapshot | undefined;
    let end: CpuSnapshot | undefined;
    const loop: ControlLoop<ProvidedMachine> = {
      process: Process.ShepherdAgentStart,
      processor: 'bench',
      selectMachines: (q) => agentStartSelection(q, { provider: PROVIDER }),
      async processMachine({ work }) {
        await work.finish({ set: { agentStarted: { publicKey: PUBLIC_KEY } } });
        if (++done === WARMUP) warm = snapshot();
        if (done === ITEMS) {
          end = snapshot();
          elapsed = performance.now() - start;
          roundTrips.enabled = false;
          stop.abort();
        }
      },
    };
    roundTrips.enabled = true;
    const start = performance.now();
    await runControlLoop(bmdb, loop, {
      parallelism: CONCURRENCY,
      claimLimiter: parseLimiter(UNBOUND_LIMITER),
      signal: stop.signal,
    });
    await bmdb.close();
    const statements = await server.withClient('postgres', async (client) => {
      const { rows } = await client.query<StatementRow>(
        `SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS query, calls::text,
                total_exec_time AS exec_ms, total_plan_time AS plan_ms
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
         WHERE d.datname = $1 AND query NOT LIKE '%pg_stat_statements%' AND toplevel
         ORDER BY calls DESC, total_exec_time DESC LIMIT 12`,
        [name],
      );
      return rows;
    });
    const perItem = elapsed / ITEMS;
    const rtPerItem = roundTrips.ms / ITEMS;
    const serverMs = statements.reduce((sum, s) => sum + s.exec_ms + s.plan_ms, 0);
    const fmt = (ms: number) => `${(ms * 1000).toFixed(0)} µs`;
    console.log(`\n**A worker's item** at parallelism ${CONCURRENCY}, ${ITEMS.toLocaleString('en')} items\n`);
    console.log('| per item | value |\n|---|---:|');
    console.log(
      `| wall time | ${fmt(perItem)} (${Math.round(ITEMS / (elapsed / 1000)).toLocaleString('en')} items/s) |`,
    );
    console.log(`| round trips | ${(roundTrips.count / ITEMS).toFixed(2)} |`);
    console.log(`| time in round trips (client side, summed) | ${fmt(rtPerItem)} |`);
    for (const [kind, { count, ms, all }] of roundTrips.byKind) {
      const sorted = all.sort((a, b) => a - b);
      const p = (q: number) => fmt(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0);
      console.log(
        `| of which ${kind} statements (${(count / ITEMS).toFixed(2)} per item; p50 ${p(0.5)}, p90 ${p(0.9)}) | ${fmt(ms / ITEMS)} |`,
      );
    }
    console.log(`| of which server execution + planning | ${fmt(serverMs / ITEMS)} |`);
    console.log(`| wall time with a statement in flight | ${fmt(roundTrips.busyMs / ITEMS)} |`);
    console.log(`| wall time in Node with none in flight | ${fmt(perItem - roundTrips.busyMs / ITEMS)} |`);
    if (warm && end) {
      const items = ITEMS - WARMUP;
      let backendMs = 0;
      for (const [pid, ms] of end.backends) backendMs += ms - (warm.backends.get(pid) ?? 0);
      const wallMs = end.at - warm.at;
      console.log(`| CPU of the PostgreSQL backends (after ${WARMUP} items) | ${fmt(backendMs / items)} |`);
      console.log(`| CPU of Node (after ${WARMUP} items) | ${fmt((end.node - warm.node) / items)} |`);
      console.log(`| wall time (after ${WARMUP} items) | ${fmt(wallMs / items)} |`);
    }
    console.log('\n| statement | calls per item | server µs per call |\n|---|---:|---:|');
    for (const s of statements) {
      const calls = Number(s.calls);
      console.log(
        `| \`${s.query.replaceAll('|', '\\|')}…\` | ${(calls / ITEMS).toFixed(3)} | ${(((s.exec_ms + s.plan_ms) / calls) * 1000).toFixed(0)} |`,
      );
    }
  } finally {
    await server.dropDatabase(name).catch(() => {});
    await server.stop();
  }
}

await main();
