/**
 * `npm run lab` stopped by a signal: SIGTERM to its own process, npm's, as
 * `kill` or a service manager sends it (not Ctrl-C to its terminal's whole
 * process group), and Ctrl-C, SIGINT to that group. With one VM (an IPMI
 * one: QEMU and ipmi_sim), the shepherd, its server and their embedded
 * PostgreSQL, it must stop promptly, leave no process of its tree running
 * and remove its directory.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { freePort } from '../../../test/support/ports.js';
import { eventually } from '../../../test/support/wait.js';
import { descendants, isRunning, missingForLab, type ProcessRecord } from './support.js';

const missing = await missingForLab();
if (missing.length > 0) {
  console.warn(`lab stop test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const CACHE = path.join(ROOT, '.tmp/lab-cache');
/** How long the lab may take to stop: its processes' own clean stops, seconds each on this loaded machine. */
const STOP_BOUND = 30_000;

type Exit = { code: number | null; signal: NodeJS.Signals | null };

test.skipIf(missing.length > 0)(
  'SIGTERM to the process of `npm run lab` stops the lab, every process it started and its embedded PostgreSQL, and removes its directory',
  async () => {
    await stopsCleanly((npm) => process.kill(npm, 'SIGTERM'), 'SIGTERM to npm');
  },
  600_000,
);

test.skipIf(missing.length > 0)(
  'Ctrl-C, SIGINT to the whole process group of `npm run lab` (which npm passes on to the lab again), stops it all as cleanly',
  async () => {
    await stopsCleanly((npm) => process.kill(-npm, 'SIGINT'), 'SIGINT to its group', { group: true, again: true });
  },
  600_000,
);

test.skipIf(missing.length > 0)(
  'its terminal closed, SIGHUP to the whole process group (npm dies of it, and passes nothing on), stops the lab as cleanly',
  async () => {
    await stopsCleanly((npm) => process.kill(-npm, 'SIGHUP'), 'SIGHUP to its group', { group: true, hangup: true });
  },
  600_000,
);

/**
 * Starts `npm run lab` with one VM, waits until it runs, signals it with
 * `signal` (given npm's PID), and checks that npm exits 0 within
 * {@link STOP_BOUND}, no process of its tree survives and the lab's directory
 * is gone. `group`: npm leads a process group of its own, as a terminal's job;
 * `again`: the lab gets SIGINT once more while it stops; `hangup`: npm dies of
 * the signal, so the lab's own exit is what is waited for.
 */
async function stopsCleanly(
  signal: (npm: number) => void,
  what: string,
  options: { group?: boolean; again?: boolean; hangup?: boolean } = {},
): Promise<void> {
  const parent = await mkdtemp(path.join(tmpdir(), 'lab-stop-test-'));
  const dir = path.join(parent, 'lab');
  const npm = spawn(
    'npm',
    [
      'run',
      'lab',
      '--',
      '--vms',
      '1',
      '--web-listen',
      `127.0.0.1:${await freePort()}`,
      '--cache-dir',
      CACHE,
      '--dir',
      dir,
    ],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], detached: options.group ?? false },
  );
  const pid = npm.pid as number;
  let output = '';
  for (const stream of [npm.stdout, npm.stderr]) stream.on('data', (chunk: Buffer) => (output += chunk.toString()));
  let exit: Exit | undefined;
  npm.once('exit', (code, signal) => {
    exit = { code, signal };
  });
  let tree: ProcessRecord[] = [];
  try {
    await eventually(
      'the lab started',
      async () => {
        if (exit) throw new Error(`npm run lab exited (${JSON.stringify(exit)}):\n${output.slice(-3000)}`);
        return output.includes('Ctrl-C stops the lab.') || undefined;
      },
      420_000,
      200,
    );
    tree = descendants(pid);
    const commands = tree.map((p) => p.command);
    for (const part of [
      'packages/lab/bin/lab.js',
      'qemu-system-x86_64',
      'ipmi_sim',
      'shepherd.js run static',
      'shepherd.js server',
    ]) {
      expect(
        commands.some((command) => command.includes(part)),
        part,
      ).toBe(true);
    }
    expect(commands.some((command) => /\/postgres -D /.test(command))).toBe(true);

    const signaled = Date.now();
    signal(pid);
    if (options.again) {
      // npm passes the SIGINT it got on to the lab, which had the terminal's already: a second one, for certain.
      await eventually('the lab stopping', async () => output.includes('lab: stopping (') || undefined, STOP_BOUND, 20);
      const lab = tree.find((p) => p.command.includes('packages/lab/bin/lab.js'));
      process.kill(lab?.pid as number, 'SIGINT');
    }
    if (options.hangup) {
      await eventually(
        `every process of the lab exited after ${what}`,
        async () => tree.every((p) => !isRunning(p)) || undefined,
        STOP_BOUND,
        100,
      );
      expect(exit, output.slice(-3000)).toEqual({ code: null, signal: 'SIGHUP' });
    } else {
      const ended = await eventually(`npm run lab exited after ${what}`, async () => exit, STOP_BOUND, 100);
      expect(ended, output.slice(-3000)).toEqual({ code: 0, signal: null });
    }
    console.log(
      `lab timing: stopped by ${what} in ${((Date.now() - signaled) / 1000).toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`,
    );
    expect(output).toContain('lab: stopped; files removed');
    expect(output).not.toContain('exiting at once');
    // Each shepherd process stopped cleanly, once, and every closer succeeded.
    expect(output).not.toContain('lab: stopping: ');
    expect(tree.filter(isRunning).map((p) => `${p.pid} ${p.command}`)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  } finally {
    await stopSurvivors(npm, tree);
    await rm(parent, { recursive: true, force: true });
  }
}

/** A lab that did not stop is stopped here, its processes by their IDs: SIGTERM, then SIGKILL. */
async function stopSurvivors(npm: ChildProcess, tree: readonly ProcessRecord[]): Promise<void> {
  if (npm.exitCode === null && npm.signalCode === null) tree = [...tree, ...descendants(npm.pid as number)];
  npm.kill('SIGKILL');
  const running = () => tree.filter(isRunning);
  for (const p of running()) signalIfRunning(p.pid, 'SIGTERM');
  await eventually('the lab’s processes stopped', async () => running().length === 0 || undefined, 60_000).catch(() => {
    for (const p of running()) signalIfRunning(p.pid, 'SIGKILL');
  });
}

/**
 * Signals `pid`, a process that may exit between being seen running and the
 * signal: its ESRCH must not replace the test's own failure in the report.
 */
function signalIfRunning(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ESRCH') throw error;
  }
}
