/**
 * `npm run heartbeat-instructions -w bench`: instructions per heartbeat of
 * `shepherd server` and of the floor (heartbeat-floor-server.ts), counted by
 * callgrind, so the comparison holds on a machine busy with other work,
 * where CPU seconds and latencies do not. Each server runs alone (one
 * process) under valgrind; agents on their own TLS connections send
 * heartbeats in bursts of BURST (one per agent, the next burst once all are
 * answered, so batches are alike run after run); callgrind's counters are
 * zeroed after a warm-up and dumped after the measured heartbeats. User-space
 * instructions only: the kernel's share (socket writes, wake-ups) is not
 * counted, and neither is PostgreSQL's.
 *
 * Environment: BENCH_INSTRUCTIONS_HEARTBEATS (measured, default 2,000),
 * BENCH_INSTRUCTIONS_BURST (default 10), BENCH_INSTRUCTIONS_WARM_UP (unmeasured
 * heartbeats first, default 5,000), BENCH_HEARTBEAT_SERVERS (default
 * shepherd,floor), BENCH_INSTRUCTIONS_KEEP (a directory to copy each
 * server's measured dumps to, for callgrind_annotate). Needs valgrind
 * (Debian's package).
 */
import { execFileSync } from 'node:child_process';
import { copyFile, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import path from 'node:path';
import {
  type Agent,
  connectAgents,
  freePort,
  type HeartbeatServer,
  heartbeat,
  prepareFleet,
  removeFleet,
  startServer,
  stopServer,
} from './heartbeat-fleet.js';
import { BenchServer } from './server.js';

const HEARTBEATS = Number(process.env.BENCH_INSTRUCTIONS_HEARTBEATS ?? 2_000);
const BURST = Number(process.env.BENCH_INSTRUCTIONS_BURST ?? 10);
const WARM_UP = Number(process.env.BENCH_INSTRUCTIONS_WARM_UP ?? 5_000);
const SERVERS = (process.env.BENCH_HEARTBEAT_SERVERS ?? 'shepherd,floor').split(',').map((name): HeartbeatServer => {
  if (name !== 'shepherd' && name !== 'floor') {
    throw new Error(`BENCH_HEARTBEAT_SERVERS: ${JSON.stringify(name)} is neither shepherd nor floor`);
  }
  return name;
});
const RESULTS = path.join(import.meta.dirname, '..', 'results');

export interface InstructionFigure {
  readonly server: HeartbeatServer;
  readonly heartbeats: number;
  readonly burst: number;
  /**
   * User-space instructions per heartbeat answered, by the main thread
   * (where every request is handled; the steady figure) and by all threads
   * (V8's optimizing compiler and garbage collector helpers besides, whose
   * share varies from run to run while code is still being optimized).
   */
  readonly mainThreadPerHeartbeat: number;
  readonly allThreadsPerHeartbeat: number;
  readonly loadAverage: number;
}

/** `count` heartbeats in bursts of `burst`, agents taken in turn. */
async function bursts(agents: readonly Agent[], count: number, burst: number, from = 0): Promise<number> {
  let next = from;
  for (let sent = 0; sent < count; sent += burst) {
    const calls = [];
    for (let i = 0; i < Math.min(burst, count - sent); i++) {
      calls.push(heartbeat(agents[next++ % agents.length] as Agent));
    }
    await Promise.all(calls);
  }
  return next;
}

/** Instructions executed between callgrind's zeroing and its dump named `measured`: by the main thread, and by all. */
interface Dumped {
  readonly main: number;
  readonly all: number;
}

/**
 * The counts of the dump named `measured` under `dir`, one file per thread
 * (copied to BENCH_INSTRUCTIONS_KEEP/<server>/, if set).
 */
async function dumpedInstructions(dir: string, answeredBy: HeartbeatServer): Promise<Dumped> {
  let main: number | undefined;
  let all = 0;
  const keep = process.env.BENCH_INSTRUCTIONS_KEEP;
  for (const name of await readdir(dir)) {
    if (!name.startsWith('callgrind.out')) continue;
    const text = await readFile(path.join(dir, name), 'utf8');
    if (!/^desc: Trigger: dump measured$/m.test(text)) continue;
    const total = Number(/^(?:totals|summary): (\d+)/m.exec(text)?.[1] ?? 0);
    all += total;
    if (/^thread: 1$/m.test(text)) main = total;
    if (keep) {
      await mkdir(path.join(keep, answeredBy), { recursive: true });
      await copyFile(path.join(dir, name), path.join(keep, answeredBy, name));
    }
  }
  if (main === undefined) throw new Error(`no callgrind dump named measured of the main thread under ${dir}`);
  return { main, all };
}

async function measure(bench: BenchServer, answeredBy: HeartbeatServer): Promise<InstructionFigure> {
  const fleet = await prepareFleet(bench, BURST * 10);
  const port = await freePort();
  const wrapper = [
    'valgrind',
    '--tool=callgrind',
    '--quiet',
    `--callgrind-out-file=${path.join(fleet.dir, 'callgrind.out')}`,
    '--dump-instr=no',
    '--separate-threads=yes',
  ];
  const server = await startServer(answeredBy, fleet, port, 1, wrapper);
  let agents: Agent[] = [];
  try {
    // A deadline as upstream's agent sends, but one valgrind's pace cannot pass.
    agents = await connectAgents(fleet, port, '10M');
    await Promise.all(agents.map((agent) => heartbeat(agent)));
    const next = await bursts(agents, WARM_UP, BURST);
    execFileSync('callgrind_control', ['--zero', String(server.pid)], { stdio: 'ignore' });
    await bursts(agents, HEARTBEATS, BURST, next);
    execFileSync('callgrind_control', ['--dump=measured', String(server.pid)], { stdio: 'ignore' });
    const { main, all } = await dumpedInstructions(fleet.dir, answeredBy);
    return {
      server: answeredBy,
      heartbeats: HEARTBEATS,
      burst: BURST,
      mainThreadPerHeartbeat: main / HEARTBEATS,
      allThreadsPerHeartbeat: all / HEARTBEATS,
      loadAverage: loadavg()[0] ?? 0,
    };
  } finally {
    for (const agent of agents) agent.session.destroy();
    await stopServer(server);
    await removeFleet(bench, fleet);
  }
}

/** The figures as a Markdown table, with each server's ratio to the floor. */
export function renderInstructions(figures: readonly InstructionFigure[]): string {
  const floor = figures.find((figure) => figure.server === 'floor');
  const count = (n: number) => Math.round(n).toLocaleString('en-US');
  const ratio = (n: number, of: number | undefined) => (of ? `${(n / of).toFixed(2)}×` : '');
  const lines = [
    `**Instructions per heartbeat** (callgrind, user space, one server process; ${figures[0]?.heartbeats ?? 0} heartbeats measured after ${WARM_UP} unmeasured, in bursts of ${figures[0]?.burst ?? 0}, one per agent): they do not depend on what else the machine runs.`,
    '',
    '| server | main thread | ÷ floor | all threads | ÷ floor | load average |',
    '|---|---:|---:|---:|---:|---:|',
    ...figures.map(
      (figure) =>
        `| ${figure.server} | ${count(figure.mainThreadPerHeartbeat)} | ${ratio(figure.mainThreadPerHeartbeat, floor?.mainThreadPerHeartbeat)} | ` +
        `${count(figure.allThreadsPerHeartbeat)} | ${ratio(figure.allThreadsPerHeartbeat, floor?.allThreadsPerHeartbeat)} | ${figure.loadAverage.toFixed(1)} |`,
    ),
    '',
  ];
  return lines.join('\n');
}

async function main(): Promise<void> {
  const startedAt = new Date();
  const bench = await BenchServer.start();
  try {
    const figures: InstructionFigure[] = [];
    for (const answeredBy of SERVERS) {
      const figure = await measure(bench, answeredBy);
      process.stderr.write(
        `[bench] instructions (${answeredBy}): ${Math.round(figure.mainThreadPerHeartbeat)} per heartbeat on the main thread, ${Math.round(figure.allThreadsPerHeartbeat)} on all, load average ${figure.loadAverage.toFixed(1)}\n`,
      );
      figures.push(figure);
    }
    const report = renderInstructions(figures);
    console.log(report);
    await mkdir(RESULTS, { recursive: true });
    const stamp = startedAt.toISOString().replace(/[:.]/g, '-');
    const json = `${JSON.stringify({ startedAt: startedAt.toISOString(), instructions: figures }, null, 2)}\n`;
    await writeFile(path.join(RESULTS, `${stamp}-instructions.json`), json);
    await writeFile(path.join(RESULTS, 'latest-heartbeat-instructions.md'), `${report}\n`);
  } finally {
    await bench.stop();
  }
}

await main();
