import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chown, mkdir, open, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { type PostgresInstallation, postgresInstallation } from './installation.js';
import { waitUntilAccepting } from './ready.js';

/**
 * How a postgres child process reaches the data directory: by its path, or,
 * as root, through a descriptor of it opened here and inherited as fd 3. The
 * postgres user may be unable to walk the path (a checkout under `/root`);
 * `/proc/self/fd/3` leads into the directory without walking it.
 */
interface DataDirAccess {
  /** How the child names `name` inside the data directory. */
  path(name: string): string;
  readonly stdio: ['ignore', 'pipe', 'pipe', ...number[]];
  close(): Promise<void>;
}

async function dataDirAccess(dataDir: string, installation: PostgresInstallation): Promise<DataDirAccess> {
  if (!installation.user) {
    return { path: (name) => path.join(dataDir, name), stdio: ['ignore', 'pipe', 'pipe'], close: async () => {} };
  }
  const handle = await open(dataDir, 'r');
  return {
    path: (name) => `/proc/self/fd/3/${name}`,
    stdio: ['ignore', 'pipe', 'pipe', handle.fd],
    close: () => handle.close(),
  };
}

/** Options of {@link initdb}. */
export interface InitdbOptions {
  /** The directory whose `pgdata/` to initialise. */
  readonly dataDir: string;
  readonly user: string;
  readonly password: string;
  readonly onLog: (line: string) => void;
}

/** Creates a cluster in `<dataDir>/pgdata`, owned by the user postgres runs as. */
export async function initdb(options: InitdbOptions): Promise<void> {
  const installation = await postgresInstallation();
  const pgdata = path.join(options.dataDir, 'pgdata');
  const passwordFile = path.join(options.dataDir, `initdb-password-${randomBytes(4).toString('hex')}`);
  // initdb refuses a directory that is not empty, naming it.
  await mkdir(pgdata, { recursive: true, mode: 0o700 });
  await writeFile(passwordFile, `${options.password}\n`, { mode: 0o600 });
  const access = await dataDirAccess(options.dataDir, installation);
  try {
    if (installation.user) {
      await chown(pgdata, installation.user.uid, installation.user.gid);
      await chown(passwordFile, installation.user.uid, installation.user.gid);
    }
    const child = spawn(
      path.join(installation.bin, 'initdb'),
      [
        `--pgdata=${access.path('pgdata')}`,
        '--auth=scram-sha-256',
        `--username=${options.user}`,
        `--pwfile=${access.path(path.basename(passwordFile))}`,
        '--encoding=UTF8',
        '--locale=C',
      ],
      { ...installation.user, stdio: access.stdio, env: { ...process.env, LC_ALL: 'C' } },
    );
    const output = forwardLines(child, options.onLog);
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
      child.once('error', reject);
      child.once('close', (exitCode, exitSignal) => resolve([exitCode, exitSignal]));
    });
    if (code !== 0) {
      throw new Error(`initdb exited with ${signal ?? `status ${code}`}: ${output().slice(-5).join('; ')}`);
    }
  } finally {
    await access.close();
    await rm(passwordFile, { force: true });
  }
}

/** Sends each line a child prints to `onLog`; returns the lines seen last. */
function forwardLines(child: ChildProcess, onLog: (line: string) => void): () => string[] {
  const recent: string[] = [];
  for (const stream of [child.stdout, child.stderr]) {
    stream?.setEncoding('utf8');
    stream?.on('data', (chunk: string) => {
      for (const line of chunk.split('\n')) {
        if (!line.trim()) continue;
        onLog(line.trim());
        recent.push(line.trim());
        if (recent.length > 20) recent.shift();
      }
    });
  }
  return () => recent;
}

export interface PostgresProcessOptions {
  /** The directory whose `pgdata/` to run. */
  readonly dataDir: string;
  readonly port: number;
  readonly flags: readonly string[];
  /** A URL to probe readiness with. */
  readonly probeUrl: string;
  readonly onLog: (line: string) => void;
}

/** How long a fast shutdown may take before the server is killed. */
const STOP_TIMEOUT = 60_000;
const START_TIMEOUT = 60_000;

/**
 * A postgres server process in a process group of its own, so a terminal's
 * Ctrl-C (sent to the whole foreground group) reaches only us: we stop it
 * after our own clean stop, not before.
 */
export class PostgresProcess {
  #exited: Promise<void>;

  private constructor(private readonly child: ChildProcess) {
    this.#exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) resolve();
      else child.once('exit', () => resolve());
    });
    // Should this process exit without stop() (process.exit on a second
    // signal, say), take the server down with us rather than orphan it.
    process.once('exit', this.#onExit);
  }

  readonly #onExit = () => {
    if (this.running) this.child.kill('SIGINT');
  };

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Starts the server and resolves once it accepts connections. */
  static async start(options: PostgresProcessOptions): Promise<PostgresProcess> {
    const installation = await postgresInstallation();
    const access = await dataDirAccess(options.dataDir, installation);
    let child: ChildProcess;
    let spawnError: Promise<never>;
    try {
      child = spawn(
        path.join(installation.bin, 'postgres'),
        ['-D', access.path('pgdata'), '-p', String(options.port), ...options.flags],
        {
          ...installation.user,
          detached: true,
          stdio: access.stdio,
          env: { ...process.env, LC_MESSAGES: 'C' },
        },
      );
      // Listened for at once: an 'error' event without a listener (EACCES, ENOENT) would crash the process.
      spawnError = new Promise<never>((_, reject) => child.once('error', reject));
      spawnError.catch(() => {});
    } finally {
      // The child holds its own copy of the descriptor.
      await access.close();
    }
    forwardLines(child, options.onLog);
    const server = new PostgresProcess(child);
    try {
      await Promise.race([server.#ready(options.probeUrl), spawnError]);
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  /** Fast shutdown (SIGINT); killed if it has not exited within a minute. Idempotent. */
  async stop(): Promise<void> {
    process.off('exit', this.#onExit);
    // Never started (spawn failed): nothing to stop, no exit to wait for.
    if (this.child.pid === undefined) return;
    if (this.running) this.child.kill('SIGINT');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_TIMEOUT);
    await this.#exited;
    clearTimeout(timer);
  }

  #ready(probeUrl: string): Promise<void> {
    return waitUntilAccepting(probeUrl, {
      timeout: START_TIMEOUT,
      exited: () =>
        this.running
          ? undefined
          : new Error(`postgres exited during start-up (${this.child.exitCode ?? this.child.signalCode})`),
    });
  }
}
