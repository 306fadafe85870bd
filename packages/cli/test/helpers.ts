import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, rmdirSync } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { sleep } from '@bmaas/common';
import { expect } from 'vitest';

export { eventually } from '../../../test/support/wait.js';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const bin = fileURLToPath(new URL('../bin/shepherd.js', import.meta.url));

/**
 * The binary runs the compiled packages: bring them up to date (incremental,
 * a second or two when nothing changed). `npm test` builds first as well.
 * One build per machine at a time: test files run in parallel and must not
 * write the same outputs at once.
 */
export async function buildOnce(): Promise<void> {
  const lock = path.join(tmpdir(), 'shepherd-ts-build.lock');
  const deadline = Date.now() + 120_000;
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`build lock ${lock} held for too long; remove it if stale`);
      await sleep(200);
    }
  }
  try {
    execFileSync(`${root}node_modules/.bin/tsc`, ['--build'], { cwd: root, stdio: 'inherit' });
  } finally {
    rmdirSync(lock);
  }
}

export interface Result {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** A running `shepherd` process. */
export class Shepherd {
  stdout = '';
  stderr = '';
  readonly exited: Promise<Result>;

  constructor(readonly child: ChildProcess) {
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
      this.stdout += chunk;
    });
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    this.exited = new Promise((resolve) =>
      child.once('close', (code, signal) => resolve({ code, signal, stdout: this.stdout, stderr: this.stderr })),
    );
  }

  /** Waits until stderr (the log) matches `pattern`. */
  async logged(pattern: RegExp, timeout = 30_000): Promise<void> {
    const deadline = Date.now() + timeout;
    while (!pattern.test(this.stderr)) {
      if (this.child.exitCode !== null) throw new Error(`shepherd exited before logging ${pattern}:\n${this.stderr}`);
      if (Date.now() > deadline)
        throw new Error(`shepherd did not log ${pattern} within ${timeout}ms:\n${this.stderr}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/**
 * Starts `shepherd <args>` with `env` added to a clean environment (no
 * inherited SHEPHERD_*); a variable `undefined` in `env` is left unset.
 */
export function start(args: readonly string[], env: Record<string, string | undefined> = {}): Shepherd {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('SHEPHERD_')));
  const merged = { ...inherited, DEBUG: 'shepherd:*,bmdb:*,-bmdb:embedded', ...env };
  const child = spawn(process.execPath, [bin, ...args], {
    cwd: root,
    env: Object.fromEntries(Object.entries(merged).filter(([, value]) => value !== undefined)),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new Shepherd(child);
}

/** Runs `shepherd <args>` to its end. */
export function shepherd(args: readonly string[], env: Record<string, string | undefined> = {}): Promise<Result> {
  return start(args, env).exited;
}

/** A fake Equinix API as `run equinix` is pointed at it. */
interface EquinixEndpoint {
  readonly url: string;
  readonly projectId: string;
}

/**
 * `shepherd run equinix` against `api`, its SSH key label `name` and device
 * prefix `name-` (so tests sharing an API keep apart), then `flags` (name
 * without `--` → value) in order. The API key goes in the environment
 * (`SHEPHERD_EQUINIX_API_KEY`), never in the arguments.
 */
export function runEquinixArgs(
  api: EquinixEndpoint,
  name: { label: string; devicePrefix: string },
  flags: Readonly<Record<string, string | number>> = {},
): string[] {
  return [
    'run',
    'equinix',
    ...flagArgs({
      'equinix-api-url': api.url,
      'equinix-project-id': api.projectId,
      'equinix-ssh-key-label': name.label,
      'equinix-device-prefix': name.devicePrefix,
      ...flags,
    }),
  ];
}

/** `{ 'bmdb-url': url }` as `['--bmdb-url', url]`, in the object's order. */
export function flagArgs(flags: Readonly<Record<string, string | number>>): string[] {
  return Object.entries(flags).flatMap(([flag, value]) => [`--${flag}`, String(value)]);
}

/**
 * A usage error as the CLI must give it: exit 2, `message` on one line of
 * its own (debug log lines, timestamped, aside), no secret echoed, and
 * nothing written under `dataDir`.
 */
export async function expectUsageError(result: Result, message: RegExp, dataDir: string): Promise<void> {
  expect(result.code).toBe(2);
  expect(result.stderr).toMatch(message);
  const lines = result.stderr
    .trim()
    .split('\n')
    .filter((line) => !/^\d{4}-\d\d-\d\dT/.test(line));
  expect(lines).toHaveLength(1);
  expect(result.stderr).not.toContain('hunter2');
  await expect(stat(dataDir)).rejects.toThrow(/ENOENT/); // nothing touched
}

/**
 * The detached test agents heartbeating for machines of `db` (found by their
 * command line, `test-agent.js --heartbeat <machine ID>`), by machine ID.
 */
export async function agentHeartbeaters(db: {
  admin(text: string): Promise<{ rows: { machine_id: string }[] }>;
}): Promise<Map<string, number>> {
  const machines = new Set((await db.admin('SELECT machine_id FROM machines')).rows.map((row) => row.machine_id));
  const found = new Map<string, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = (await readFile(`/proc/${entry}/cmdline`, 'utf8')).split('\0');
      const machineId = argv[argv.indexOf('--heartbeat') + 1];
      if (argv.includes('--heartbeat') && machineId && machines.has(machineId)) found.set(machineId, Number(entry));
    } catch {}
  }
  return found;
}

/** SIGKILL, whether or not the process is still there. */
export function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {}
}
