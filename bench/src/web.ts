import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadavg } from 'node:os';
import { BMDB, type Database } from '@bmaas/bmdb-controlloop';
import { fleetPageHandler } from '@bmaas/web';
import { type CompiledQuery, Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { fillFleet } from './fleet.js';
import { explain } from './scale.js';
import type { BenchServer } from './server.js';
import { percentile } from './stats.js';

/** Server time of one page: milliseconds from request to the last byte, on loopback. */
export interface PageTiming {
  readonly page: string;
  readonly status: number;
  readonly bytes: number;
  readonly p50: number;
  readonly p95: number;
  readonly samples: number;
}

export interface WebResult {
  readonly machines: number;
  readonly historyRows: number;
  readonly activeBackoffs: number;
  readonly pages: readonly PageTiming[];
  /** The machine's 1-minute load average before and after the timed requests (other processes share it). */
  readonly loadAverage: readonly [number, number];
  /** EXPLAIN (ANALYZE, BUFFERS) of every query each page sends, by page. */
  readonly plans: Record<string, string[]>;
}

const CAUSES = [
  'ssh: connect to 10.0.0.1:22: connection refused',
  'ssh: handshake failed: no supported methods remain',
  'agent: takeover failed: exit status 1',
  'agent: upload timed out after 60s',
  'provider: device is not running (Provisioning)',
  'provider: API returned 503 Service Unavailable',
  'reboot failed: 409 Conflict',
  'ssh: host key mismatch',
];

/**
 * The fleet page at `machines` machines and ten history rows each: every page
 * requested `samples` times, one at a time, over HTTP on loopback, after a
 * warm-up; then each page's queries explained.
 */
export async function webPages(server: BenchServer, machines: number, samples: number): Promise<WebResult> {
  const name = `bench_web_${machines}`;
  const url = await server.createDatabase(name);
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-web', runtimeInfo: 'bench' });
  const holders = await Promise.all(
    ['shepherd-provisioner', 'shepherd-initializer', 'shepherd-recoverer', 'dummy-heartbeats'].map((processor) =>
      bmdb.startSession({ processor, interval: 3600_000 }),
    ),
  );
  let http: Server | undefined;
  let explainServer: Server | undefined;
  try {
    const facts = await server.withClient(name, (client) => fill(client, machines, holders[1]?.id as string));
    http = await listen(createServer(fleetPageHandler({ db: bmdb.db })));
    const base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
    const pages = [
      '/',
      '/machines',
      '/machines?stage=provided',
      '/machines?stage=agentStarting',
      '/machines?stage=agentStarted',
      '/machines?stage=heartbeating',
      '/machines?stage=awaitingRecovery',
      '/machines?stage=unprovided',
      '/machines?provider=Bench',
      '/machines?work=ShepherdAgentStart',
      '/machines?backoff=any',
      '/machines?backoff=ShepherdRecovery',
      '/machines?held=yes',
      '/machines?held=no',
      '/machines?power=Off',
      '/machines?power=Unread',
      '/machines?power=On&held=no',
      '/machines?q=bench-4242',
      '/machines?q=bench-',
      `/machines?q=${facts.sampleMachine.slice(0, 4)}`,
      `/machines?after=${facts.middleMachine}`,
      `/machines/${facts.sampleMachine}`,
      '/api/overview',
      '/api/machines?stage=heartbeating&limit=500',
      `/api/machines/${facts.sampleMachine}`,
    ];
    const timings: PageTiming[] = [];
    const loadBefore = loadavg()[0] ?? 0;
    for (const page of pages) {
      for (let i = 0; i < 5; i++) await timed(base + page);
      const times: number[] = [];
      let last = { status: 0, bytes: 0 };
      for (let i = 0; i < samples; i++) {
        const result = await timed(base + page);
        times.push(result.ms);
        last = result;
      }
      timings.push({
        page,
        status: last.status,
        bytes: last.bytes,
        p50: percentile(times, 50),
        p95: percentile(times, 95),
        samples,
      });
      process.stderr.write(`[bench] web ${page}: p50 ${percentile(times, 50).toFixed(1)} ms\n`);
    }

    const loadAfter = loadavg()[0] ?? 0;

    // The same pages again through a Kysely that records each query, to explain them.
    const pool = new pg.Pool({ connectionString: url, max: 1, options: '-c enable_seqscan=off' });
    const captured: CompiledQuery[] = [];
    const logged = new Kysely<Database>({
      dialect: new PostgresDialect({ pool }),
      log: (event) => {
        if (event.level === 'query') captured.push(event.query);
      },
    });
    const plans: Record<string, string[]> = {};
    try {
      explainServer = await listen(createServer(fleetPageHandler({ db: logged })));
      const explainBase = `http://127.0.0.1:${(explainServer.address() as AddressInfo).port}`;
      for (const page of pages) {
        captured.length = 0;
        await timed(explainBase + page);
        // The transaction's own statements (start transaction, commit) have no plan.
        const queries = captured.filter((query) => /^\s*(select|with)\b/i.test(query.sql));
        plans[page] = [];
        for (const query of queries) {
          plans[page].push(
            `${query.sql.replace(/\s+/g, ' ').trim()}\n${await explain(pool, query.sql, query.parameters)}`,
          );
        }
      }
    } finally {
      await logged.destroy();
    }
    return {
      machines,
      historyRows: facts.historyRows,
      activeBackoffs: facts.activeBackoffs,
      pages: timings,
      loadAverage: [loadBefore, loadAfter],
      plans,
    };
  } finally {
    for (const s of [http, explainServer]) if (s) await new Promise((resolve) => s.close(resolve));
    await bmdb.close();
    await server.dropDatabase(name);
  }
}

async function timed(url: string): Promise<{ ms: number; status: number; bytes: number }> {
  const start = performance.now();
  const response = await fetch(url, { redirect: 'manual' });
  const body = await response.arrayBuffer();
  return { ms: performance.now() - start, status: response.status, bytes: body.byteLength };
}

function listen(server: Server): Promise<Server> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

/**
 * `machines` provided machines (nearly all heartbeating, some lost, some
 * waiting for an agent), 200 without a Provided tag, ten history rows per
 * machine with failures, running and expired backoffs over a few causes, and
 * live work held by `sessionId`.
 */
async function fill(
  client: pg.Client,
  machines: number,
  sessionId: string,
): Promise<{ historyRows: number; activeBackoffs: number; sampleMachine: string; middleMachine: string }> {
  await fillFleet(client, { total: machines, ready: 2_000, lost: 500 });
  await client.query(`INSERT INTO machines SELECT FROM generate_series(1, 200)`);
  await client.query(
    `INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
     SELECT mp.machine_id,
            CASE WHEN i < 6 THEN 'ShepherdAgentStart' ELSE 'ShepherdRecovery' END,
            (ARRAY['Started', 'Failed', 'Started', 'Finished', 'Started', 'Finished',
                   'Started', 'Canceled', 'Started', 'Finished'])[i + 1],
            now() - make_interval(mins => (10 - i) * 7) - random() * interval '1 minute',
            CASE WHEN i = 1 THEN ($1::text[])[1 + (hashtext(mp.machine_id::text) & 7)]
                 WHEN i = 7 THEN 'session expired' END
     FROM machine_provided mp, generate_series(0, 9) AS i`,
    [CAUSES],
  );
  // Backoffs: 5% running, 3% expired.
  await client.query(
    `INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
     SELECT machine_id, CASE WHEN n % 3 = 0 THEN 'ShepherdRecovery' ELSE 'ShepherdAgentStart' END,
            CASE WHEN n % 8 < 5 THEN now() + make_interval(secs => n % 600) ELSE now() - interval '1 hour' END,
            ($1::text[])[1 + (n % 8)], 60
     FROM (SELECT machine_id, row_number() OVER () AS n FROM machine_provided ORDER BY machine_id LIMIT $2) b`,
    [CAUSES, Math.round(machines * 0.08)],
  );
  await client.query(
    `INSERT INTO work (machine_id, session_id, process)
     SELECT machine_id, $1, 'ShepherdAgentStart' FROM machine_agent_pending ORDER BY machine_id LIMIT 200`,
    [sessionId],
  );
  await client.query('VACUUM ANALYZE');
  const { rows } = await client.query<{ history: string; active: string; sample: string; middle: string }>(
    `SELECT (SELECT count(*) FROM work_history) AS history,
            (SELECT count(*) FROM work_backoff WHERE until > now()) AS active,
            (SELECT machine_id FROM work_backoff WHERE until > now() ORDER BY machine_id LIMIT 1) AS sample,
            (SELECT machine_id FROM machines ORDER BY machine_id OFFSET $1 LIMIT 1) AS middle`,
    [Math.floor(machines / 2)],
  );
  const row = rows[0];
  if (!row) throw new Error('the bench fleet is empty');
  return {
    historyRows: Number(row.history),
    activeBackoffs: Number(row.active),
    sampleMachine: row.sample,
    middleMachine: row.middle,
  };
}
