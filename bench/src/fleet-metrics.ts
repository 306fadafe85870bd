import { loadavg } from 'node:os';
import { BMDB, type Database } from '@bmaas/bmdb-controlloop';
import { type CompiledQuery, Kysely, PostgresDialect } from 'kysely';
import type pg from 'pg';
import { Registry } from 'prom-client';
// The reading is the library's own, run from its sources: the gauges, the
// reader's connection settings and its transaction.
import { FleetGaugeSet } from '../../packages/bmdb-model/src/fleet-gauges.js';
import { readerConnection, readFleet } from '../../packages/bmdb-model/src/fleet-metrics.js';
import { SingleConnection } from '../../packages/bmdb-model/src/internal/single-connection.js';
import { fillFleet } from './fleet.js';
import type { BenchServer } from './server.js';
import { percentile } from './stats.js';

/** One state of the fleet, read `readings` times. */
export interface FleetReadingFigure {
  readonly scenario: string;
  readonly readings: number;
  /** Milliseconds per reading, in the reading process: every query in one transaction, one round trip each. */
  readonly p50: number;
  readonly p95: number;
  /** Milliseconds of execution per reading in PostgreSQL (pg_stat_statements, every statement of the reading). */
  readonly executionMs: number;
  /** Milliseconds of CPU per reading of the backend serving it (Linux /proc): parsing, planning, execution, protocol. */
  readonly backendCpuMs: number;
  /** 1-minute load average before and after (the machine is shared). */
  readonly loadAverage: readonly [number, number];
}

export interface FleetMetricsResult {
  readonly machines: number;
  readonly locations: number;
  readonly hardwareReports: number;
  readonly activeBackoffs: number;
  readonly figures: readonly FleetReadingFigure[];
  /** EXPLAIN (ANALYZE, BUFFERS) of every statement of a reading, steady fleet. */
  readonly plans: readonly string[];
}

/** 16 locations, as a provider's sites or racks. */
const LOCATIONS = 16;
/** An AgentHardwareReport: 2 × 32 threads, 256 GiB, four 3.84 TB disks (its totals are written beside it). */
const TOTALS = { cpuThreads: 64, memoryBytes: 256 * 2 ** 30, disks: 4, diskBytes: 4 * 3_840_000_000_000 };

/**
 * The fleet gauges' reading at `machines` machines, as the reader runs it
 * (`FleetMetrics`: its connection settings, one REPEATABLE READ, READ ONLY
 * transaction): first a steady fleet (2% waiting for an agent, 0.5% awaiting
 * recovery, 200 machines worked on, 8% with a backoff, every started agent's
 * hardware reported), then one where a tenth of the fleet went silent.
 */
export async function fleetReadings(
  server: BenchServer,
  machines: number,
  readings: number,
): Promise<FleetMetricsResult> {
  const name = `bench_fleet_${machines}`;
  const url = await server.createDatabase(name);
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-fleet', runtimeInfo: 'bench' });
  const holders = await Promise.all(
    ['shepherd-provisioner', 'shepherd-initializer', 'shepherd-recoverer', 'dummy-heartbeats'].map((processor) =>
      bmdb.startSession({ processor, interval: 3600_000 }),
    ),
  );
  const connection = new SingleConnection(readerConnection({ connectionString: url }, 30_000), () => {});
  try {
    const facts = await server.withClient(name, (client) => fill(client, machines, holders[1]?.id as string));
    await connection.open();
    const captured: CompiledQuery[] = [];
    const db = new Kysely<Database>({
      dialect: new PostgresDialect({ pool: connection }),
      log: (event) => {
        if (event.level === 'query') captured.push(event.query);
      },
    });
    const gauges = new FleetGaugeSet(new Registry());
    const figures = [await measure(server, name, db, gauges, 'steady', readings)];

    // The statements of one reading, explained on the reader's own connection.
    captured.length = 0;
    await readFleet(db, gauges, {});
    const plans: string[] = [];
    for (const query of captured.filter((q) => /^\s*(select|with)\b/i.test(q.sql))) {
      const { rows } = await db.executeQuery<{ 'QUERY PLAN': string }>({
        ...query,
        sql: `EXPLAIN (ANALYZE, BUFFERS) ${query.sql}`,
      });
      plans.push(`${query.sql.replace(/\s+/g, ' ').trim()}\n${rows.map((row) => row['QUERY PLAN']).join('\n')}`);
    }

    // A tenth of the fleet's agents fall silent (a site cut off): the sets read key by key grow.
    await server.withClient(name, async (client) => {
      await client.query(
        `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = agent_heartbeat_at - interval '20 minutes'
         WHERE machine_id IN (SELECT machine_id FROM machine_agent_heartbeat ORDER BY machine_id LIMIT $1)`,
        [Math.round(machines / 10)],
      );
      await settle(client);
    });
    figures.push(await measure(server, name, db, gauges, 'a tenth silent', readings));
    return { machines, locations: LOCATIONS, ...facts, figures, plans };
  } finally {
    await connection.end();
    await bmdb.close();
    await server.dropDatabase(name);
  }
}

async function measure(
  server: BenchServer,
  name: string,
  db: Kysely<Database>,
  gauges: FleetGaugeSet,
  scenario: string,
  readings: number,
): Promise<FleetReadingFigure> {
  // Filling the fleet takes minutes: its heartbeats move up to now, keeping
  // their distances, or every agent would be silent by the time it is read.
  await server.withClient(name, async (client) => {
    await client.query(
      `UPDATE machine_agent_heartbeat SET agent_heartbeat_at = agent_heartbeat_at
         + (now() - interval '30 seconds' - (SELECT max(agent_heartbeat_at) FROM machine_agent_heartbeat))`,
    );
    await settle(client);
  });
  for (let i = 0; i < 3; i++) await readFleet(db, gauges, {});
  const loadBefore = loadavg()[0] ?? 0;
  // The extension lives in the server's postgres database; its view covers every database.
  await server.withClient('postgres', (client) => client.query('SELECT pg_stat_statements_reset()'));
  const cpuBefore = server.backendCpu(name);
  const times: number[] = [];
  for (let i = 0; i < readings; i++) {
    const start = performance.now();
    gauges.set(await readFleet(db, gauges, {}));
    times.push(performance.now() - start);
  }
  const cpuAfter = server.backendCpu(name);
  const execution = await server.withClient('postgres', async (client) => {
    const { rows } = await client.query<{ ms: number }>(
      `SELECT coalesce(sum(total_exec_time), 0)::float8 AS ms FROM pg_stat_statements
       WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) AND query NOT LIKE '%pg_stat_statements%'`,
      [name],
    );
    return rows[0]?.ms ?? 0;
  });
  let cpu = 0;
  for (const [pid, ms] of cpuAfter) cpu += ms - (cpuBefore.get(pid) ?? 0);
  const figure: FleetReadingFigure = {
    scenario,
    readings,
    p50: percentile(times, 50),
    p95: percentile(times, 95),
    executionMs: execution / readings,
    backendCpuMs: cpu / readings,
    loadAverage: [loadBefore, loadavg()[0] ?? 0],
  };
  process.stderr.write(
    `[bench] fleet reading (${scenario}): p50 ${figure.p50.toFixed(1)} ms, execution ${figure.executionMs.toFixed(1)} ms, backend CPU ${figure.backendCpuMs.toFixed(1)} ms, load ${figure.loadAverage[1].toFixed(1)}\n`,
  );
  return figure;
}

/**
 * `machines` provided machines in {@link LOCATIONS} locations (set by an
 * update, through the triggers that keep the per-place totals), 2% waiting
 * for an agent, 500 silent past the threshold, every started agent's
 * hardware reported, 8% backed off (5% running), 200 agent starts held by
 * `sessionId`.
 */
async function fill(
  client: pg.Client,
  machines: number,
  sessionId: string,
): Promise<{ hardwareReports: number; activeBackoffs: number }> {
  await fillFleet(client, { total: machines, ready: Math.round(machines * 0.02), lost: 500 });
  await client.query(`UPDATE machine_provided SET provider_location = 'site-' || (hashtext(machine_id::text) & $1)`, [
    LOCATIONS - 1,
  ]);
  await client.query(
    `INSERT INTO machine_hardware_report
       (machine_id, hardware_report_raw, hardware_reported_at, cpu_threads, memory_bytes, disks, disk_bytes)
     SELECT machine_id, '\\x0a00'::bytea, now(), $1, $2, $3, $4 FROM machine_agent_started`,
    [TOTALS.cpuThreads, TOTALS.memoryBytes, TOTALS.disks, TOTALS.diskBytes],
  );
  await client.query(
    `INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
     SELECT machine_id, CASE WHEN n % 3 = 0 THEN 'ShepherdRecovery' ELSE 'ShepherdAgentStart' END,
            CASE WHEN n % 8 < 5 THEN now() + make_interval(secs => n % 600) ELSE now() - interval '1 hour' END,
            'bench', 60
     FROM (SELECT machine_id, row_number() OVER () AS n FROM machine_provided ORDER BY machine_id LIMIT $1) b`,
    [Math.round(machines * 0.08)],
  );
  await client.query(
    `INSERT INTO work (machine_id, session_id, process)
     SELECT machine_id, $1, 'ShepherdAgentStart' FROM machine_agent_pending ORDER BY machine_id LIMIT 200`,
    [sessionId],
  );
  await settle(client);
  const { rows } = await client.query<{ reports: number; active: number }>(
    `SELECT (SELECT count(*)::int FROM machine_hardware_report) AS reports,
            (SELECT count(*)::int FROM work_backoff WHERE until > now()) AS active`,
  );
  return { hardwareReports: rows[0]?.reports ?? 0, activeBackoffs: rows[0]?.active ?? 0 };
}

/**
 * The tables as autovacuum leaves them between bursts of writes: dead rows
 * gone, pages all-visible (index-only scans read no heap). The server commits
 * asynchronously (server.ts), so WAL is flushed first: a page whose rows'
 * commit is not yet flushed cannot be marked all-visible; the second pass
 * marks the pages the first cleaned.
 */
async function settle(client: pg.Client): Promise<void> {
  await client.query('CHECKPOINT');
  await client.query('VACUUM');
  await client.query('VACUUM ANALYZE');
}
