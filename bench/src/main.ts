/**
 * `npm run bench`: every figure of the BMDB control-loop library, measured on
 * one embedded PostgreSQL server in one run, medians over several rounds.
 * Prints a table and writes JSON (and the table as Markdown) to results/.
 *
 * Environment: BENCH_ROUNDS (default 3), BENCH_ITEMS (work items per
 * throughput round, default 10,000), BENCH_CONCURRENCY (comma-separated,
 * default 1,8,32), BENCH_ONLY (comma-separated sections: throughput,
 * ceiling, scale, pickup, idle, heartbeat, web, fleet, power, install), BENCH_POWER_MACHINES (machines
 * the power sync reads, default 1,000), BENCH_AGENTS (simulated agents
 * of the heartbeat section, default 1,000), BENCH_HEARTBEAT_RATES (offered
 * heartbeats/s, default 500,1000,2000,3300,5000), BENCH_INSTALL_MIB (image sizes the test agent
 * installs, default 64,256), BENCH_HEARTBEAT_WORKERS (server
 * processes, default 1,2), BENCH_HEARTBEAT_SECONDS (per rate, default 10),
 * BENCH_HEARTBEAT_SERVERS (what answers: shepherd, floor; default both), BENCH_WEB_MACHINES (default
 * 100,000), BENCH_FLEET_MACHINES (the fleet gauges' reading, default 100,000), BENCH_SYSTEMS (`|`-separated systems for
 * throughput: bmdb-controlloop, "bmdb-controlloop, finish()",
 * "bmdb-controlloop, finish(fn)", graphile-worker, pg-boss).
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { writeCeiling } from './ceiling.js';
import { fleetReadings } from './fleet-metrics.js';
import { heartbeats } from './heartbeat.js';
import { idleCost } from './idle.js';
import { installFigures } from './install.js';
import { pickupLatency } from './pickup.js';
import { powerSyncRate } from './power.js';
import { type BenchResult, type Rounds, renderFleetPlans, renderReport, renderWebPlans } from './report.js';
import { claimAtScale } from './scale.js';
import { BenchServer } from './server.js';
import { latency, summarize } from './stats.js';
import {
  bmdbControlLoop,
  bmdbControlLoopBare,
  bmdbControlLoopCallback,
  graphileWorker,
  type Measure,
  pgBoss,
  UNBOUND_LIMITER,
} from './throughput.js';
import { webPages } from './web.js';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const ONLY = new Set(
  (process.env.BENCH_ONLY ?? 'throughput,ceiling,scale,pickup,idle,heartbeat,web,fleet,power,install').split(','),
);
/** Image sizes (MiB) the test agent installs, raw and gzipped. */
const INSTALL_MIB = (process.env.BENCH_INSTALL_MIB ?? '64,256').split(',').map(Number);
/** Machines the power sync reads, one fake BMC system each. */
const POWER_MACHINES = Number(process.env.BENCH_POWER_MACHINES ?? 1_000);
/** Machines of the fleet page's benchmark (ten history rows each). */
const WEB_MACHINES = Number(process.env.BENCH_WEB_MACHINES ?? 100_000);
/** Machines of the fleet gauges' benchmark. */
const FLEET_MACHINES = Number(process.env.BENCH_FLEET_MACHINES ?? 100_000);
const ITEMS = Number(process.env.BENCH_ITEMS ?? 10_000);
const CONCURRENCY = (process.env.BENCH_CONCURRENCY ?? '1,8,32').split(',').map(Number);
const SCALES = [1_000, 10_000, 100_000];
const AGENTS = Number(process.env.BENCH_AGENTS ?? 1_000);
/** Offered heartbeat rates: what one process sustains; a 100,000-machine fleet at 30 s is 3,300/s; the target 5,000/s; and past it. */
const HEARTBEAT_RATES = (process.env.BENCH_HEARTBEAT_RATES ?? '500,1000,2000,3300,5000').split(',').map(Number);
/** `shepherd server --workers` values measured, each at every rate. */
const HEARTBEAT_WORKERS = (process.env.BENCH_HEARTBEAT_WORKERS ?? '1,2').split(',').map(Number);
const HEARTBEAT_SECONDS = Number(process.env.BENCH_HEARTBEAT_SECONDS ?? 10);
/** What answers: `shepherd server`, and the floor any Node server stands on (see heartbeat-floor-server.ts). */
const HEARTBEAT_SERVERS = (process.env.BENCH_HEARTBEAT_SERVERS ?? 'shepherd,floor').split(',').map((name) => {
  if (name !== 'shepherd' && name !== 'floor') {
    throw new Error(`BENCH_HEARTBEAT_SERVERS: ${JSON.stringify(name)} is neither shepherd nor floor`);
  }
  return name;
});
const RESULTS = path.join(import.meta.dirname, '..', 'results');

const BARE = 'bmdb-controlloop, finish()';
const CALLBACK = 'bmdb-controlloop, finish(fn)';
/** Variants measured at the highest concurrency only, as reference points. */
const REFERENCES = new Set([BARE, CALLBACK]);
const ALL_SYSTEMS: Record<string, Measure> = {
  'bmdb-controlloop': bmdbControlLoop,
  [BARE]: bmdbControlLoopBare,
  [CALLBACK]: bmdbControlLoopCallback,
  'graphile-worker': graphileWorker,
  'pg-boss': pgBoss,
};
const systems = Object.fromEntries(
  Object.entries(ALL_SYSTEMS).filter(([name]) => (process.env.BENCH_SYSTEMS ?? name).split('|').includes(name)),
);

function progress(message: string): void {
  process.stderr.write(`[bench] ${message}\n`);
}

async function main(): Promise<void> {
  const startedAt = new Date();
  const server = await BenchServer.start();
  try {
    const machine = await server.machine();
    progress(`${machine.cpu}, ${machine.cores} cores, PostgreSQL ${machine.postgres}`);
    const result: BenchResult = {
      startedAt: startedAt.toISOString(),
      rounds: ROUNDS,
      machine,
      limiter: UNBOUND_LIMITER,
      items: ITEMS,
    };

    if (ONLY.has('throughput')) {
      const throughput: Record<string, Record<number, Rounds>> = {};
      for (const concurrency of CONCURRENCY) {
        for (let round = 0; round < ROUNDS; round++) {
          // Interleaved, so drift in the machine hits every system alike.
          for (const [system, measure] of Object.entries(systems)) {
            // The other finish forms are reference points; one concurrency keeps the run short.
            if (REFERENCES.has(system) && concurrency !== Math.max(...CONCURRENCY)) continue;
            const { perSecond, retried } = await measure(server, ITEMS, concurrency);
            progress(
              `throughput ${system} ×${concurrency} round ${round + 1}: ${perSecond.toFixed(0)}/s` +
                (retried === undefined ? '' : `, ${retried} transactions retried`),
            );
            throughput[system] ??= {};
            const entry = throughput[system];
            const rounds = [...(entry[concurrency]?.rounds ?? []), perSecond];
            const retries = retried === undefined ? undefined : [...(entry[concurrency]?.retried ?? []), retried];
            entry[concurrency] = { ...summarize(rounds), rounds, ...(retries && { retried: retries }) };
          }
        }
      }
      result.throughput = throughput;
    }

    if (ONLY.has('ceiling')) {
      const ceiling: Record<number, Rounds> = {};
      for (const connections of CONCURRENCY) {
        const rounds: number[] = [];
        for (let round = 0; round < ROUNDS; round++) rounds.push(await writeCeiling(server, connections, 1_500));
        ceiling[connections] = { ...summarize(rounds), rounds };
        progress(`ceiling ×${connections}: ${summarize(rounds).median.toFixed(0)} tx/s`);
      }
      result.ceiling = ceiling;
    }

    if (ONLY.has('scale')) {
      const scale: NonNullable<BenchResult['scale']> = {};
      for (const machines of SCALES) {
        const measured = await claimAtScale(server, machines, { ready: 300, rounds: ROUNDS, iterations: 80 });
        scale[machines] = {
          machines,
          claim: latency(measured.claims),
          finish: latency(measured.finishes),
          plans: measured.plans,
        };
        progress(`scale ${machines}: claim p50 ${latency(measured.claims).p50.toFixed(2)} ms`);
      }
      result.scale = scale;
    }

    if (ONLY.has('pickup')) {
      const samples: number[] = [];
      for (let round = 0; round < ROUNDS; round++) samples.push(...(await pickupLatency(server, 10)));
      result.pickup = { ...latency(samples), all: samples };
      progress(`pickup p50 ${latency(samples).p50.toFixed(1)} ms`);
    }

    if (ONLY.has('idle')) {
      const rounds: number[] = [];
      for (let round = 0; round < ROUNDS; round++) rounds.push(await idleCost(server, 4, 6_000));
      result.idle = { workers: 4, ...summarize(rounds), rounds };
      progress(`idle ${summarize(rounds).median.toFixed(2)} statements/s per worker`);
    }

    if (ONLY.has('heartbeat')) {
      const figures = [];
      // Each server beside the floor, one after the other, so the ratio of their CPU sees the same machine.
      for (const workers of HEARTBEAT_WORKERS) {
        for (const answeredBy of HEARTBEAT_SERVERS) {
          figures.push(...(await heartbeats(server, AGENTS, workers, HEARTBEAT_RATES, HEARTBEAT_SECONDS, answeredBy)));
        }
      }
      result.heartbeat = figures;
      for (const figure of result.heartbeat) {
        progress(
          `heartbeat (${figure.server}) ${figure.agents} agents, ${figure.workers} workers, offered ${figure.offered}/s: ${figure.perSecond.toFixed(0)}/s, ` +
            `p50 ${figure.latency.p50.toFixed(1)} ms, p99 ${figure.latency.p99.toFixed(1)} ms, ` +
            `${figure.statementsPerHeartbeat.toFixed(3)} statements per heartbeat, ${figure.failed} failed, ${figure.missed} missed, ` +
            `schedule lag p99 ${figure.scheduleLagP99.toFixed(1)} ms; load average ${figure.loadAverage.toFixed(1)}; CPU s/s ` +
            `server ${figure.cpu.server.toFixed(2)}, generator ${figure.cpu.generator.toFixed(2)}, postgres ${figure.cpu.postgres.toFixed(2)}`,
        );
      }
    }
    if (ONLY.has('web')) {
      result.web = await webPages(server, WEB_MACHINES, 50);
    }
    if (ONLY.has('fleet')) {
      result.fleet = await fleetReadings(server, FLEET_MACHINES, 30);
    }

    if (ONLY.has('power')) {
      result.power = await powerSyncRate(server, POWER_MACHINES, [1, 4, 16]);
    }

    if (ONLY.has('install')) {
      result.install = await installFigures(server, INSTALL_MIB);
      for (const f of result.install) {
        progress(
          `install ${f.imageMiB} MiB ${f.compression}: ${f.writeMBps.toFixed(1)} MB/s, request to success ${f.requestToSuccessSeconds.toFixed(2)} s`,
        );
      }
    }

    result.durationSeconds = (Date.now() - startedAt.getTime()) / 1000;
    const report = renderReport(result);
    console.log(report);
    if (result.web) console.log(renderWebPlans(result.web));
    if (result.fleet) console.log(renderFleetPlans(result.fleet));
    await mkdir(RESULTS, { recursive: true });
    const stamp = startedAt.toISOString().replace(/[:.]/g, '-');
    const json = `${JSON.stringify(result, null, 2)}\n`;
    await writeFile(path.join(RESULTS, `${stamp}.json`), json);
    // A run of some sections only keeps its own latest, beside the full run's.
    const latest = process.env.BENCH_ONLY ? `latest-${[...ONLY].join('+')}` : 'latest';
    await writeFile(path.join(RESULTS, `${latest}.json`), json);
    await writeFile(path.join(RESULTS, `${latest}.md`), `${report}\n`);
    if (result.web) await writeFile(path.join(RESULTS, 'web-plans.md'), `${renderWebPlans(result.web)}\n`);
    if (result.fleet) await writeFile(path.join(RESULTS, 'fleet-plans.md'), `${renderFleetPlans(result.fleet)}\n`);
  } finally {
    await server.stop();
  }
}

await main();
