import type { FleetMetricsResult } from './fleet-metrics.js';
import type { HeartbeatFigure } from './heartbeat.js';
import type { InstallFigure } from './install.js';
import type { PowerSyncFigure } from './power.js';
import type { MachineInfo } from './server.js';
import type { Latency, Summary } from './stats.js';

export type Rounds = Summary & { readonly rounds: readonly number[]; readonly retried?: readonly number[] };

import type { WebResult } from './web.js';

export interface ScaleFigure {
  readonly machines: number;
  readonly claim: Latency;
  readonly finish: Latency;
  readonly plans: Record<string, string>;
}

/** Everything one run measured; written as JSON, rendered as Markdown. */
export interface BenchResult {
  startedAt: string;
  rounds: number;
  machine: MachineInfo;
  limiter: string;
  items?: number;
  throughput?: Record<string, Record<number, Rounds>>;
  ceiling?: Record<number, Rounds>;
  scale?: Record<number, ScaleFigure>;
  pickup?: Latency & { readonly all: readonly number[] };
  idle?: Rounds & { readonly workers: number };
  heartbeat?: readonly HeartbeatFigure[];
  web?: WebResult;
  fleet?: FleetMetricsResult;
  power?: readonly PowerSyncFigure[];
  install?: readonly InstallFigure[];
  durationSeconds?: number;
}

const int = (n: number) => Math.round(n).toLocaleString('en-US');
const ms = (n: number) => (n < 10 ? n.toFixed(2) : n.toFixed(0));
const spread = (r: Summary, format = int) => `${format(r.median)} (${format(r.min)}–${format(r.max)})`;

/** Milliseconds of CPU per heartbeat answered, from CPU seconds per second. */
const cpuPerHeartbeat = (figure: HeartbeatFigure, cpuPerSecond: number) =>
  (cpuPerSecond * 1000) / Math.max(1, figure.perSecond);
const perHeartbeat = (figure: HeartbeatFigure, cpuPerSecond: number) =>
  cpuPerHeartbeat(figure, cpuPerSecond).toFixed(3);

/** The results as Markdown tables, for the terminal and the README alike. */
export function renderReport(result: BenchResult): string {
  const { machine } = result;
  const lines = [
    `Machine: ${machine.cpu}, ${machine.cores} cores, ${machine.memoryGiB} GiB RAM; Node ${machine.node}; ` +
      `PostgreSQL ${machine.postgres} (embedded, one server for every figure) with ${machine.settings}.`,
    `Medians over ${result.rounds} rounds, (min–max) in brackets${result.durationSeconds ? `; the run took ${Math.round(result.durationSeconds / 60)} minutes` : ''}.`,
    '',
  ];
  const { throughput, ceiling } = result;
  if (throughput) {
    const concurrency = Object.keys(Object.values(throughput)[0] ?? {}).map(Number);
    lines.push(
      `**Throughput**: ${int(result.items ?? 10_000)} no-op work items, items/s; rate limiter \`${result.limiter}\` (never binds). ` +
        '`bmdb-controlloop`: each task sets AgentStarted with `work.finish({ set: { agentStarted } })`, the fastest form that records what the initializer does (claims and finishes of concurrent workers share statements); ' +
        '`finish()`: a bare release, as a job queue completes a job; `finish(fn)`: AgentStarted set by a callback in a transaction of its own per item. ' +
        'graphile-worker: defaults; pg-boss: one worker per unit of concurrency, batch size 1, re-notified after each job so it does not sleep its polling interval.',
      '',
      `| system | ${concurrency.map((c) => `×${c}`).join(' | ')} |`,
      `|---|${concurrency.map(() => '---:').join('|')}|`,
    );
    for (const [system, byConcurrency] of Object.entries(throughput)) {
      lines.push(
        `| ${system} | ${concurrency.map((c) => (byConcurrency[c] ? spread(byConcurrency[c]) : '')).join(' | ')} |`,
      );
    }
    const isOurs = (system: string) => system.startsWith('bmdb-controlloop');
    for (const [system, ours] of Object.entries(throughput).filter(([s]) => isOurs(s))) {
      for (const [other, theirs] of Object.entries(throughput).filter(([s]) => !isOurs(s))) {
        lines.push(
          `| ${system} ÷ ${other} | ${concurrency
            .map((c) => (ours[c] && theirs[c] ? `${(ours[c].median / theirs[c].median).toFixed(2)}×` : ''))
            .join(' | ')} |`,
        );
      }
    }
    if (ceiling) {
      lines.push(
        `| server ceiling, write tx/s | ${concurrency.map((c) => (ceiling[c] ? spread(ceiling[c]) : '')).join(' | ')} |`,
      );
    }
    lines.push('');
  }
  if (result.scale) {
    lines.push(
      '**Scale**: one claim (one statement), then one finish setting AgentStarted (`finish({ set: { agentStarted } })`, one statement), at a time; 300 machines ready, every other one with a heartbeating agent. Milliseconds.',
      '',
      '| machines | claim p50 | claim p99 | finish p50 | finish p99 |',
      '|---:|---:|---:|---:|---:|',
    );
    for (const figure of Object.values(result.scale)) {
      lines.push(
        `| ${int(figure.machines)} | ${ms(figure.claim.p50)} | ${ms(figure.claim.p99)} | ${ms(figure.finish.p50)} | ${ms(figure.finish.p99)} |`,
      );
    }
    const largest = Object.values(result.scale).at(-1);
    if (largest) {
      const sequential = Object.entries(largest.plans)
        .filter(([, plan]) => plan.includes('Seq Scan'))
        .map(([name]) => name);
      lines.push(
        '',
        `Plans at ${int(largest.machines)} machines (in the JSON): ${Object.keys(largest.plans).join(', ')}; ` +
          (sequential.length
            ? `sequential scans in ${sequential.join(', ')}.`
            : 'index scans only, no sequential scan.'),
      );
    }
    lines.push('');
  }
  if (result.pickup || result.idle) {
    lines.push('| idle behaviour at default settings | value |', '|---|---:|');
    if (result.pickup) {
      lines.push(
        `| pickup latency p50 / p99 (${result.pickup.samples} samples) | ${ms(result.pickup.p50)} / ${ms(result.pickup.p99)} ms |`,
      );
    }
    if (result.idle) {
      lines.push(
        `| idle statements per second per worker (${result.idle.workers} workers) | ${spread(result.idle, (n) => n.toFixed(2))} |`,
      );
    }
    lines.push('');
  }
  if (result.heartbeat?.length) {
    const [first] = result.heartbeat;
    lines.push(
      `**Heartbeats** through the BMaaS server (\`@bmaas/server\`, \`shepherd server --workers N\`) and the floor beside it: ${int(first?.agents ?? 0)} simulated agents, ` +
        "each on its own TLS connection with its own ed25519 client certificate, sent on an open-loop schedule (offered rate), one run per rate, every call with a 10 s `grpc-timeout` as upstream's agent sends; " +
        'latency from each heartbeat’s scheduled send time to its answer (a send due while its agent waits for an answer goes when the answer comes; still waiting at the end: missed, counted in the latencies with the time waited). ' +
        'The load generator (one process) runs on the same machine; schedule lag: how late it sent, its own share of the latency. Statements: calls of the heartbeat statement (pg_stat_statements) per heartbeat. ' +
        'CPU: milliseconds of CPU per heartbeat answered, of the server processes, the load generator and PostgreSQL (the backends serving the benchmark’s database); ÷ floor: the server’s CPU per heartbeat over the floor’s at the same workers and offered rate, in the same run; the load average at the end of each rate (the machine is shared). ' +
        'Server *floor*: the same generator against the least a Node server does per heartbeat (HTTP/2 and TLS with the client key read, an empty answer; no gRPC library, no database: `bench/src/heartbeat-floor-server.ts`), what bounds any Node server with the generator on the same cores.',
      '',
      '| workers | offered/s | server | answered/s | p50 | p99 | failed / missed | CPU ms per heartbeat: server / generator / PostgreSQL | server ÷ floor | statements per heartbeat | schedule lag p99 | load average |',
      '|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    );
    const order = (figure: HeartbeatFigure) => [figure.workers, figure.offered, figure.server === 'floor' ? 1 : 0];
    const byPlace = [...result.heartbeat].sort((a, b) => {
      const [x, y] = [order(a), order(b)];
      return (x[0] ?? 0) - (y[0] ?? 0) || (x[1] ?? 0) - (y[1] ?? 0) || (x[2] ?? 0) - (y[2] ?? 0);
    });
    for (const figure of byPlace) {
      const floor = result.heartbeat.find(
        (f) => f.server === 'floor' && f.workers === figure.workers && f.offered === figure.offered,
      );
      const ratio = floor
        ? cpuPerHeartbeat(figure, figure.cpu.server) / cpuPerHeartbeat(floor, floor.cpu.server)
        : undefined;
      lines.push(
        `| ${figure.workers} | ${int(figure.offered)} | ${figure.server ?? 'shepherd'} | ${int(figure.perSecond)} | ${ms(figure.latency.p50)} ms | ${ms(figure.latency.p99)} ms | ${figure.failed} / ${figure.missed} | ` +
          `${perHeartbeat(figure, figure.cpu.server)} / ${perHeartbeat(figure, figure.cpu.generator)} / ${perHeartbeat(figure, figure.cpu.postgres)} | ` +
          `${ratio === undefined ? '' : `${ratio.toFixed(2)}×`} | ${figure.statementsPerHeartbeat.toFixed(3)} | ${ms(figure.scheduleLagP99)} ms | ${figure.loadAverage.toFixed(1)} |`,
      );
    }
    lines.push('');
  }
  if (result.web) {
    const { web } = result;
    lines.push(
      `**Fleet page** at ${int(web.machines)} machines, ${int(web.historyRows)} history rows, ${int(web.activeBackoffs)} running backoffs: ` +
        `server time per page (request to last byte over loopback, one at a time, ${web.pages[0]?.samples ?? 0} samples after a warm-up), ms; ` +
        `load average ${web.loadAverage[0].toFixed(1)} before, ${web.loadAverage[1].toFixed(1)} after.`,
      '',
      '| page | status | KiB | p50 | p95 |',
      '|---|---:|---:|---:|---:|',
      ...web.pages.map(
        (p) =>
          `| \`${p.page.replace(/[0-9a-f]{8}-[0-9a-f-]{27}/, '<id>')}\` | ${p.status} | ${(p.bytes / 1024).toFixed(1)} | ${ms(p.p50)} | ${ms(p.p95)} |`,
      ),
      '',
    );
    const sequential = Object.entries(web.plans)
      .filter(([, plans]) => plans.some((plan) => /Seq Scan on (?!p\b)/.test(plan)))
      .map(([page]) => page);
    lines.push(
      `Plans of every query of every page follow the tables (and are in the JSON): ${
        sequential.length ? `sequential scans in ${sequential.join(', ')}.` : 'index scans only, no sequential scan.'
      }`,
      '',
    );
  }
  if (result.fleet) {
    const { fleet } = result;
    lines.push(
      `**Fleet gauges**: one reading of every \`bmdb_fleet_*\` gauge as \`FleetMetrics\` runs it (its connection, one REPEATABLE READ, READ ONLY transaction), ` +
        `at ${int(fleet.machines)} machines in ${fleet.locations} locations, ${int(fleet.hardwareReports)} hardware reports, ${int(fleet.activeBackoffs)} running backoffs, ` +
        '2% waiting for an agent, 200 being started, 1% held, power states read (0.5% Off, 0.2% failed, 1% never read); *a tenth silent*: then a tenth of the agents stop heartbeating (the sets read key by key grow). ' +
        'Per reading: time in the reading process, execution time in PostgreSQL (pg_stat_statements), CPU of the backend serving it; ' +
        `${fleet.figures[0]?.readings ?? 0} readings after a warm-up, tables as autovacuum leaves them.`,
      '',
      '| fleet | reading p50 | p95 | execution per reading | backend CPU per reading | load average |',
      '|---|---:|---:|---:|---:|---:|',
      ...fleet.figures.map(
        (f) =>
          `| ${f.scenario} | ${ms(f.p50)} ms | ${ms(f.p95)} ms | ${ms(f.executionMs)} ms | ${ms(f.backendCpuMs)} ms | ${f.loadAverage[0].toFixed(1)} → ${f.loadAverage[1].toFixed(1)} |`,
      ),
      '',
      `Plans of every statement of a reading: [bench/results/fleet-plans.md](fleet-plans.md) (and the JSON): ${
        fleet.plans.some((plan) => plan.includes('Seq Scan'))
          ? 'a sequential scan in some.'
          : 'index scans only, no sequential scan.'
      }`,
      '',
    );
  }
  if (result.power?.length) {
    lines.push(
      `**Power sync** with its limiter out of the way: ${int(result.power[0]?.machines ?? 0)} static machines, each a system of one fake Redfish BMC over HTTPS on loopback, every one read once (a lease, the GET, a record: two statements a read), beside the same GETs through the Redfish client alone.`,
      '',
      '| readers | power states read/s | BMC GETs alone/s | load average before → after |',
      '|---:|---:|---:|---|',
      ...result.power.map(
        (f) =>
          `| ${f.concurrency} | ${int(f.syncPerSecond)} | ${int(f.getsPerSecond)} | ${f.loadAverage[0].toFixed(2)} → ${f.loadAverage[1].toFixed(2)} |`,
      ),
      '',
    );
  }
  if (result.install?.length) {
    lines.push(
      `**OS installation** by the bundled test agent (\`packages/shepherd-manager/bin/test-agent.js\`), one fresh agent per image: a real BMaaS server, an HTTPS image server on loopback sending at full speed, random bytes (gzip level 1 for the gzipped), the disk a file in the system's temporary directory. Write rate: bytes written a second from the download's start to the flush, as the agent logs it; request to success: from the request to the stored Success report, by the database's clock (the agent heartbeats every ${result.install[0]?.heartbeatIntervalMs} ms, so delivery waits up to one interval).`,
      '',
      '| image | compression | agent write MB/s | request to success | load average after |',
      '|---:|---|---:|---:|---:|',
      ...result.install.map(
        (f) =>
          `| ${f.imageMiB} MiB | ${f.compression} | ${f.writeMBps.toFixed(1)} | ${f.requestToSuccessSeconds.toFixed(2)} s | ${f.loadAverage.toFixed(2)} |`,
      ),
      '',
    );
  }
  return lines.join('\n');
}

/** Every statement of a fleet gauges' reading with its EXPLAIN (ANALYZE, BUFFERS). */
export function renderFleetPlans(fleet: FleetMetricsResult): string {
  const lines = [`Query plans of a reading of the fleet gauges at ${int(fleet.machines)} machines:`, ''];
  for (const plan of fleet.plans) lines.push('```', plan, '```', '');
  return lines.join('\n');
}

/** Every query of every fleet page with its EXPLAIN (ANALYZE, BUFFERS). */
export function renderWebPlans(web: WebResult): string {
  const lines = [`Query plans of the fleet page at ${int(web.machines)} machines:`, ''];
  for (const [page, plans] of Object.entries(web.plans)) {
    lines.push(`### ${page}`, '');
    for (const plan of plans) lines.push('```', plan, '```', '');
  }
  return lines.join('\n');
}
