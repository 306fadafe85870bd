/**
 * Helpers of the chaos tests: real `shepherd` processes (each in a process
 * group of its own, killed whatever happens to the test), the fake agent's
 * record of agent starts, and samplers watching the BMDB while they run.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep } from '@bmaas/common';
import pg from 'pg';
import { afterAll, afterEach } from 'vitest';
import { Shepherd } from '../../packages/cli/test/helpers.js';

export { buildOnce } from '../../packages/cli/test/helpers.js';
export { eventually } from '../support/wait.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const BIN = path.join(ROOT, 'packages/cli/bin/shepherd.js');
export const TEST_AGENT = path.join(ROOT, 'packages/shepherd-manager/bin/test-agent.js');

const running = new Set<ChaosShepherd>();

/** A `shepherd` process of a chaos test, in its own process group. */
export class ChaosShepherd extends Shepherd {
  constructor(
    readonly name: string,
    args: readonly string[],
    env: Record<string, string>,
  ) {
    const inherited = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('SHEPHERD_')));
    super(
      spawn(process.execPath, [BIN, ...args], {
        cwd: ROOT,
        env: { ...inherited, DEBUG: 'shepherd:*,bmdb:*,-bmdb:embedded', DEBUG_COLORS: '0', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
      }),
    );
    running.add(this);
    void this.exited.then(() => running.delete(this));
  }

  get pid(): number {
    const pid = this.child.pid;
    if (pid === undefined) throw new Error(`shepherd ${this.name} has no pid`);
    return pid;
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Signals the whole process group. */
  signal(signal: NodeJS.Signals): void {
    try {
      process.kill(-this.pid, signal);
    } catch {}
  }

  /** SIGTERM, then SIGKILL if it has not stopped within `grace` ms; resolves once it exited. */
  async stop(grace = 40_000): Promise<void> {
    if (!this.alive) return;
    this.signal('SIGTERM');
    const timer = setTimeout(() => this.signal('SIGKILL'), grace);
    await this.exited;
    clearTimeout(timer);
  }

  /** Lines of the log matching `pattern`. */
  lines(pattern: RegExp): string[] {
    return this.stderr.split('\n').filter((line) => pattern.test(line));
  }

  /** Resident set size in KiB, from /proc. */
  rssKiB(): number {
    const status = readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const match = /^VmRSS:\s+(\d+) kB/m.exec(status);
    if (!match) throw new Error(`no VmRSS for ${this.pid}`);
    return Number(match[1]);
  }
}

/** Kills every shepherd still running (SIGKILL to its group) and waits for it. */
export async function killAll(): Promise<void> {
  await Promise.all(
    [...running].map(async (shepherd) => {
      shepherd.signal('SIGKILL');
      await shepherd.exited;
    }),
  );
}

/** Registers the kill of every shepherd after each test and after the file. */
export function killShepherdsAfterEach(): void {
  afterEach(killAll);
  afterAll(killAll);
}

/** `run dummy` arguments for a fast, deterministic fleet. */
export function dummyArgs(options: {
  url: string;
  name: string;
  capacity: number;
  agentLog: string;
  agentStartDuration?: string;
  parallelism?: number;
  extra?: readonly string[];
}): string[] {
  return [
    'run',
    'dummy',
    '--bmdb-url',
    options.url,
    '--component-name',
    options.name,
    '--dummy-capacity',
    String(options.capacity),
    '--dummy-agent-failure-rate',
    '0',
    '--dummy-heartbeat-failure-rate',
    '0',
    '--dummy-heartbeat-interval',
    '2s',
    '--dummy-agent-start-duration',
    options.agentStartDuration ?? '0s',
    '--dummy-agent-start-log',
    options.agentLog,
    '--provisioner-max-machines',
    '0',
    '--provisioner-reservation-chunk-size',
    String(options.capacity),
    '--provisioner-device-creation-rate',
    '1ms,1000',
    '--provisioner-reconciler-rate',
    '1s,1',
    '--initializer-loop-parallelism',
    String(options.parallelism ?? 4),
    '--initializer-db-query-rate',
    '1ms,1000',
    ...(options.extra ?? []),
  ];
}

/** One line of `--dummy-agent-start-log`. */
export interface AgentStartLine {
  readonly phase: 'begin' | 'end';
  readonly machine: string;
  readonly address: string;
  readonly outcome?: 'started' | 'failed';
  readonly pid: number;
  readonly at: number;
}

/** The fake agents' record of agent starts (a line cut short by a kill is skipped). */
export function readAgentLog(file: string): AgentStartLine[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  const lines: AgentStartLine[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      const parsed = JSON.parse(line) as Omit<AgentStartLine, 'at'> & { at: string };
      lines.push({ ...parsed, at: Date.parse(parsed.at) });
    } catch {}
  }
  return lines;
}

/** One agent start on one machine: from its `begin` to its `end` (absent if its process died first). */
export interface AgentStart {
  readonly machine: string;
  readonly pid: number;
  readonly begin: number;
  readonly end: number | undefined;
  readonly outcome: 'started' | 'failed' | undefined;
}

/** Pairs begin and end lines (per machine and pid, in order). */
export function agentStarts(lines: readonly AgentStartLine[]): AgentStart[] {
  const open = new Map<string, AgentStartLine[]>();
  const starts: AgentStart[] = [];
  for (const line of lines) {
    const key = `${line.machine}/${line.pid}`;
    if (line.phase === 'begin') {
      open.set(key, [...(open.get(key) ?? []), line]);
      continue;
    }
    const begun = open.get(key)?.shift();
    if (!begun) throw new Error(`agent log: an end without a begin for ${key}`);
    starts.push({ machine: line.machine, pid: line.pid, begin: begun.at, end: line.at, outcome: line.outcome });
  }
  for (const begun of open.values()) {
    for (const line of begun) {
      starts.push({ machine: line.machine, pid: line.pid, begin: line.at, end: undefined, outcome: undefined });
    }
  }
  return starts.sort((a, b) => a.begin - b.begin);
}

/**
 * Agent starts on the same machine by different processes that overlap in
 * time (an unfinished start counts until `deadOf(pid)`, the time its process
 * died, or forever).
 */
export function overlappingStarts(
  starts: readonly AgentStart[],
  deadOf: (pid: number) => number | undefined = () => undefined,
): Array<[AgentStart, AgentStart]> {
  const byMachine = new Map<string, AgentStart[]>();
  for (const start of starts) byMachine.set(start.machine, [...(byMachine.get(start.machine) ?? []), start]);
  const overlaps: Array<[AgentStart, AgentStart]> = [];
  const endOf = (s: AgentStart) => s.end ?? deadOf(s.pid) ?? Number.POSITIVE_INFINITY;
  for (const list of byMachine.values()) {
    for (let i = 0; i < list.length; i++) {
      for (let j = i + 1; j < list.length; j++) {
        const a = list[i] as AgentStart;
        const b = list[j] as AgentStart;
        if (a.begin < endOf(b) && b.begin < endOf(a)) overlaps.push([a, b]);
      }
    }
  }
  return overlaps;
}

/** A row of the `work` table with its session, as a sampler saw it. */
export interface WorkSample {
  readonly machine: string;
  readonly process: string;
  readonly session: string;
  readonly component: string;
  readonly live: boolean;
}

/**
 * Samples the `work` table with each claim's session every `interval` ms
 * until stopped, and records every moment at which one machine was held by
 * live sessions of two different components (shepherd processes) at once.
 */
export class WorkSampler {
  readonly violations: Array<{ at: number; machine: string; holders: string[] }> = [];
  samples = 0;
  /** Most live claims seen at once. */
  maxClaims = 0;
  readonly #client: pg.Client;
  #stopped = false;
  #loop: Promise<void> | undefined;

  constructor(url: string) {
    this.#client = new pg.Client({ connectionString: url });
    this.#client.on('error', () => {});
  }

  async start(interval = 25): Promise<void> {
    await this.#client.connect();
    this.#loop = (async () => {
      while (!this.#stopped) {
        try {
          this.#check(await this.sample());
        } catch {
          // The database may be down on purpose; the next sample tries again.
        }
        await sleep(interval);
      }
    })();
  }

  /** One look at the work table, in one statement (one snapshot). */
  async sample(): Promise<WorkSample[]> {
    const { rows } = await this.#client.query<WorkSample>(`
      SELECT w.machine_id AS machine, w.process, w.session_id AS session, s.component_name AS component,
             s.deadline > now() AS live
      FROM work w JOIN sessions s ON s.session_id = w.session_id`);
    this.samples++;
    return rows;
  }

  #check(rows: readonly WorkSample[]): void {
    const live = rows.filter((row) => row.live);
    this.maxClaims = Math.max(this.maxClaims, live.length);
    const holders = new Map<string, Set<string>>();
    for (const row of live) holders.set(row.machine, (holders.get(row.machine) ?? new Set()).add(row.component));
    for (const [machine, components] of holders) {
      if (components.size > 1) this.violations.push({ at: Date.now(), machine, holders: [...components] });
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
    await this.#client.end().catch(() => {});
  }
}

/** A query against `url` on a connection of its own. */
export async function query<R extends pg.QueryResultRow>(url: string, text: string, values?: unknown[]): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => {});
  await client.connect();
  try {
    return (await client.query<R>(text, values)).rows;
  } finally {
    await client.end();
  }
}

/** A fixed-width table for the test output. */
export function table(rows: ReadonlyArray<Readonly<Record<string, string | number>>>): string {
  const first = rows[0];
  if (!first) return '(none)';
  const columns = Object.keys(first);
  const width = (column: string) => Math.max(column.length, ...rows.map((row) => String(row[column] ?? '').length));
  const line = (cells: (column: string) => string) => columns.map((c) => cells(c).padEnd(width(c))).join('  ');
  return [line((c) => c), ...rows.map((row) => line((c) => String(row[c] ?? '')))].join('\n');
}
