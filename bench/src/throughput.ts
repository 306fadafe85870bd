import { BMDB, type ControlLoop, parseLimiter, runControlLoop } from '@bmaas/bmdb-controlloop';
import { agentStartSelection, Process, type ProvidedMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { Logger, makeWorkerUtils, run as runGraphileWorker } from 'graphile-worker';
import pg from 'pg';
import PgBoss from 'pg-boss';
import { Registry } from 'prom-client';
import { fillFleet, PROVIDER } from './fleet.js';
import type { BenchServer } from './server.js';
import { since } from './stats.js';

/** A limiter that never binds: a million tokens, refilled every millisecond. */
export const UNBOUND_LIMITER = '1ms,1000000';
const PUBLIC_KEY = new Uint8Array(32);

/** One round: work items per second, and transactions retried after serialization failures (ours only). */
export interface RoundResult {
  readonly perSecond: number;
  readonly retried?: number;
}

export type Measure = (server: BenchServer, items: number, concurrency: number) => Promise<RoundResult>;

/**
 * `runControlLoop` over `items` ready machines, each task finishing its work
 * by setting AgentStarted as the initializer does, in the declarative form
 * `work.finish({ set: { agentStarted } })`: claims and finishes of
 * concurrent workers go to the database in shared statements.
 */
export const bmdbControlLoop: Measure = (server, items, concurrency) => runBmdb(server, items, concurrency, 'tag');

/**
 * The same with the tag set by a callback, `work.finish((q) => ...)`: a
 * transaction of its own per item, three round trips (BEGIN with the
 * release, the tag, COMMIT).
 */
export const bmdbControlLoopCallback: Measure = (server, items, concurrency) =>
  runBmdb(server, items, concurrency, 'callback');

/**
 * The same with `work.finish()` and no tag: a claim and a release (both
 * batched like the rest), what a job queue does per job. Machines stay
 * eligible, so the `items` work items come from the same machines over and
 * over.
 */
export const bmdbControlLoopBare: Measure = (server, items, concurrency) => runBmdb(server, items, concurrency, 'bare');

async function runBmdb(
  server: BenchServer,
  items: number,
  concurrency: number,
  finish: 'tag' | 'callback' | 'bare',
): Promise<RoundResult> {
  const name = `bench_bmdb_${finish}_${concurrency}`;
  const url = await server.createDatabase(name);
  const registry = new Registry();
  const bmdb = await BMDB.open({
    url,
    migrate: true,
    metrics: registry,
    componentName: 'bench',
    runtimeInfo: 'bench',
    poolSize: Math.max(20, concurrency + 4),
  });
  try {
    await server.withClient(name, (client) => fillFleet(client, { total: items, ready: items, held: 0 }));
    const stop = new AbortController();
    let done = 0;
    let elapsed = 0;
    const start = performance.now();
    const loop: ControlLoop<ProvidedMachine> = {
      process: Process.ShepherdAgentStart,
      processor: 'bench',
      defaultBackoff: { initial: 60_000, maximum: 60_000, exponent: 1 },
      selectMachines: (q) => agentStartSelection(q, { provider: PROVIDER }),
      async processMachine({ candidate, work }) {
        if (finish === 'tag') await work.finish({ set: { agentStarted: { publicKey: PUBLIC_KEY } } });
        else if (finish === 'callback') {
          await work.finish((q) => setAgentStarted(q, candidate.machineId, { publicKey: PUBLIC_KEY }));
        } else await work.finish();
        if (++done === items) {
          elapsed = since(start);
          stop.abort();
        }
      },
    };
    await runControlLoop(bmdb, loop, {
      parallelism: concurrency,
      claimLimiter: parseLimiter(UNBOUND_LIMITER),
      signal: stop.signal,
    });
    // Tasks in flight at the stop finish too (bare finishes may pass `items`).
    const { finished, machines } = await server.withClient(name, async (client) => {
      const { rows } = await client.query<{ finished: number; machines: number }>(
        `SELECT count(*)::int AS finished, count(DISTINCT machine_id)::int AS machines
         FROM work_history WHERE event = 'Finished'`,
      );
      return rows[0] ?? { finished: 0, machines: 0 };
    });
    if (finished !== done) throw new Error(`bmdb: ${done} finishes, ${finished} recorded`);
    if (finish !== 'bare' && machines !== items) {
      throw new Error(`bmdb: ${finished} finishes of ${machines} machines; want each of ${items} once`);
    }
    const retried = (await registry.getSingleMetric('bmdb_transaction_retried_total')?.get())?.values ?? [];
    return { perSecond: (items / elapsed) * 1000, retried: retried.reduce((sum, v) => sum + v.value, 0) };
  } finally {
    await bmdb.close();
    await server.dropDatabase(name);
  }
}

/**
 * graphile-worker 0.17 with `concurrency` and its defaults otherwise, on a
 * pool of ours: we end it, so no idle connection outlives the database.
 */
export const graphileWorker: Measure = async (server, items, concurrency) => {
  const name = `bench_graphile_${concurrency}`;
  const connectionString = await server.createDatabase(name);
  const pgPool = new pg.Pool({ connectionString, max: concurrency + 4 });
  pgPool.on('error', (error) => console.error('graphile-worker pool:', error.message));
  try {
    const utils = await makeWorkerUtils({ pgPool });
    try {
      await utils.migrate();
      for (let offset = 0; offset < items; offset += 1000) {
        const batch = Math.min(1000, items - offset);
        await utils.addJobs(
          Array.from({ length: batch }, (_, i) => ({ identifier: 'noop', payload: { i: offset + i } })),
        );
      }
    } finally {
      await utils.release();
    }
    // As for the BMDB: planner statistics of the filled queue.
    await server.withClient(name, (client) => client.query('VACUUM ANALYZE'));
    let done = 0;
    const allRun = deferred();
    const start = performance.now();
    const runner = await runGraphileWorker({
      pgPool,
      concurrency,
      noHandleSignals: true,
      logger: quietGraphileLogger(),
      taskList: {
        noop: async () => {
          if (++done === items) allRun.resolve();
        },
      },
    });
    await allRun.promise;
    // Completions are batched: the round ends when the database agrees.
    await waitUntil(connectionString, 'SELECT count(*)::int AS n FROM graphile_worker.jobs', 0);
    const elapsed = since(start);
    await runner.stop();
    return { perSecond: (items / elapsed) * 1000 };
  } finally {
    await pgPool.end();
    await server.dropDatabase(name);
  }
};

/**
 * pg-boss 10 with `concurrency` workers fetching one job each. A pg-boss
 * worker sleeps its polling interval (at least 0.5 s) after every fetch, so
 * each handler re-notifies its own worker: it then fetches again at once, as
 * when jobs are sent in-process. That measures pg-boss's per-job cost, not
 * its polling interval.
 */
export const pgBoss: Measure = async (server, items, concurrency) => {
  const name = `bench_pgboss_${concurrency}`;
  const connectionString = await server.createDatabase(name);
  const boss = new PgBoss({ connectionString, max: concurrency + 4, supervise: false, schedule: false });
  boss.on('error', (error) => console.error('pg-boss:', error));
  try {
    await boss.start();
    await boss.createQueue('noop');
    for (let offset = 0; offset < items; offset += 1000) {
      const batch = Math.min(1000, items - offset);
      await boss.insert(Array.from({ length: batch }, (_, i) => ({ name: 'noop', data: { i: offset + i } })));
    }
    await server.withClient(name, (client) => client.query('VACUUM ANALYZE'));
    let done = 0;
    const allRun = deferred();
    const start = performance.now();
    for (let i = 0; i < concurrency; i++) {
      let workerId = '';
      workerId = await boss.work('noop', { batchSize: 1, pollingIntervalSeconds: 0.5 }, async (jobs) => {
        done += jobs.length;
        if (done >= items) allRun.resolve();
        boss.notifyWorker(workerId);
      });
    }
    await allRun.promise;
    await waitUntil(
      connectionString,
      `SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'noop' AND state <> 'completed'`,
      0,
    );
    const elapsed = since(start);
    return { perSecond: (items / elapsed) * 1000 };
  } finally {
    await boss.stop({ graceful: false, wait: true });
    await server.dropDatabase(name);
  }
};

/** Polls `query` (returning `n`) every 10 ms until it returns `expected`. */
async function waitUntil(connectionString: string, query: string, expected: number): Promise<void> {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    for (;;) {
      const { rows } = await client.query<{ n: number }>(query);
      if (rows[0]?.n === expected) return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  } finally {
    await client.end();
  }
}

/** graphile-worker logs every worker's start and stop; keep its errors only. */
function quietGraphileLogger(): Logger {
  return new Logger(() => (level, message) => {
    if (level === 'error') console.error(`graphile-worker: ${message}`);
  });
}

function deferred(): { promise: Promise<void>; resolve(): void } {
  let resolve = () => {};
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}
