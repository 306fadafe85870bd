import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
// By path: the library's internals are not exported.
import { postgresInstallation } from '../../packages/bmdb-controlloop/src/embedded/installation.js';
import { waitUntilAccepting } from '../../packages/bmdb-controlloop/src/embedded/ready.js';
import { freePort } from './ports.js';

const run = promisify(execFile);

/**
 * Debian's PostgreSQL 15 (`postgresql-15`), else the binaries the library runs
 * (as root, a copy the postgres user can reach when the checkout is private).
 */
async function binDir(): Promise<string> {
  const debian = '/usr/lib/postgresql/15/bin';
  if (existsSync(path.join(debian, 'postgres'))) return debian;
  return (await postgresInstallation()).bin;
}

/**
 * A PostgreSQL server of a test's own, in a temporary directory, that the
 * test can stop (fast shutdown, as an operator's restart does) and start
 * again on the same port: for outages that must not hit the shared test
 * server. Trust authentication on 127.0.0.1; durability off.
 */
export class PostgresServer {
  #child: ChildProcess | undefined;
  #log = '';
  readonly #onExit = () => this.#child?.kill('SIGKILL');

  private constructor(
    readonly dir: string,
    readonly port: number,
    private readonly user: { uid: number; gid: number } | undefined,
  ) {
    process.once('exit', this.#onExit);
  }

  /** Initialises a cluster and starts it. */
  static async start(): Promise<PostgresServer> {
    const dir = await mkdtemp(path.join(tmpdir(), 'chaos-pg-'));
    const user = process.getuid?.() === 0 ? await postgresUser() : undefined;
    await chmod(dir, 0o700);
    if (user) await chown(dir, user.uid, user.gid);
    await run(
      path.join(await binDir(), 'initdb'),
      ['-D', path.join(dir, 'data'), '-U', 'postgres', '-A', 'trust', '--encoding=UTF8', '--no-sync'],
      { ...user, env: { ...process.env, LC_ALL: 'C' }, cwd: dir },
    );
    const server = new PostgresServer(dir, await freePort(), user);
    await server.start();
    return server;
  }

  /** URL of `database` as the superuser. */
  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`;
  }

  get running(): boolean {
    return this.#child !== undefined && this.#child.exitCode === null && this.#child.signalCode === null;
  }

  /** What the server logged (its last 64 KiB). */
  get log(): string {
    return this.#log;
  }

  /** Starts the server (again) on its port and waits until it accepts connections. */
  async start(): Promise<void> {
    if (this.running) return;
    const child = spawn(
      path.join(await binDir(), 'postgres'),
      [
        '-D',
        path.join(this.dir, 'data'),
        '-p',
        String(this.port),
        '-k',
        this.dir,
        '-c',
        'listen_addresses=127.0.0.1',
        '-c',
        'fsync=off',
        '-c',
        'synchronous_commit=off',
        '-c',
        'full_page_writes=off',
        '-c',
        'max_connections=300',
      ],
      { ...this.user, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LC_MESSAGES: 'C' } },
    );
    for (const stream of [child.stdout, child.stderr]) {
      stream?.setEncoding('utf8');
      stream?.on('data', (chunk: string) => {
        this.#log = (this.#log + chunk).slice(-64 * 1024);
      });
    }
    this.#child = child;
    try {
      await waitUntilAccepting(this.url(), {
        timeout: 30_000,
        exited: () => (this.running ? undefined : new Error('postgres exited during start-up')),
      });
    } catch (error) {
      throw new Error(`${(error as Error).message}\n${this.#log}`, { cause: error });
    }
  }

  /**
   * Stops the server: `fast` (SIGINT) disconnects every client and shuts down
   * cleanly, as `pg_ctl stop -m fast` and a service restart do.
   */
  async stop(mode: 'fast' | 'immediate' = 'fast'): Promise<void> {
    const child = this.#child;
    if (!child || !this.running) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill(mode === 'fast' ? 'SIGINT' : 'SIGQUIT');
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await exited;
    clearTimeout(timer);
  }

  /** Creates a database and returns its URL. */
  async createDatabase(name: string): Promise<string> {
    const client = new pg.Client({ connectionString: this.url() });
    await client.connect();
    try {
      await client.query(`CREATE DATABASE ${name}`);
    } finally {
      await client.end();
    }
    return this.url(name);
  }

  /** Stops the server and removes its directory. */
  async destroy(): Promise<void> {
    await this.stop('immediate');
    process.off('exit', this.#onExit);
    await rm(this.dir, { recursive: true, force: true });
  }
}

async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]);
  return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
}
