import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, tmpdir, totalmem } from 'node:os';
import path from 'node:path';
import { EmbeddedDatabase } from '@bmaas/bmdb-controlloop/embedded';
import pg from 'pg';

/**
 * Server flags of the benchmark run. Durability is traded for speed exactly
 * as in the test suite, so every system measured is CPU-bound rather than
 * fsync-bound; pg_stat_statements counts the idle loop's queries.
 */
export const SERVER_FLAGS = [
  '-c',
  'fsync=off',
  '-c',
  'synchronous_commit=off',
  '-c',
  'full_page_writes=off',
  '-c',
  'max_connections=300',
  '-c',
  'shared_preload_libraries=pg_stat_statements',
  '-c',
  'pg_stat_statements.track=all',
] as const;

/** Linux's USER_HZ: the unit of utime and stime in /proc/<pid>/stat. */
const CLOCK_TICKS = 100;

/** The one PostgreSQL server every figure is measured on; one database per measurement. */
export class BenchServer {
  private constructor(
    private readonly embedded: EmbeddedDatabase,
    private readonly dataDir: string,
  ) {}

  static async start(): Promise<BenchServer> {
    const dataDir = await mkdtemp(path.join(tmpdir(), 'bmdb-bench-'));
    const embedded = await EmbeddedDatabase.start({ dataDir, database: 'postgres', postgresFlags: SERVER_FLAGS });
    const server = new BenchServer(embedded, dataDir);
    await server.withClient('postgres', (client) => client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements'));
    return server;
  }

  /** Creates a fresh database and returns its URL. */
  async createDatabase(name: string): Promise<string> {
    await this.embedded.dropDatabase(name);
    await this.embedded.createDatabase(name);
    return this.embedded.urlFor(name);
  }

  async dropDatabase(name: string): Promise<void> {
    await this.embedded.dropDatabase(name);
  }

  /** Runs `fn` with a client connected to database `name`. */
  async withClient<T>(name: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
    const client = new pg.Client({ connectionString: this.embedded.urlFor(name) });
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.end();
    }
  }

  async machine(): Promise<MachineInfo> {
    const version = await this.withClient('postgres', async (client) => {
      const { rows } = await client.query<{ server_version: string }>('SHOW server_version');
      return rows[0]?.server_version ?? 'unknown';
    });
    const cpu = cpus();
    return {
      cpu: cpu[0]?.model.trim() ?? 'unknown',
      cores: cpu.length,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      postgres: version,
      settings: SERVER_FLAGS.filter((_, i) => i % 2 === 1).join(' '),
    };
  }

  /**
   * CPU time (user + system, ms) each server process serving database `name`
   * has used so far, by PID, from Linux's /proc: the backends' whole work on
   * statements, of which pg_stat_statements sees only the executor's part.
   * Empty where there is no /proc.
   */
  backendCpu(name: string): Map<number, number> {
    const cpu = new Map<number, number>();
    let postmaster: string;
    try {
      postmaster = readFileSync(path.join(this.dataDir, 'pgdata', 'postmaster.pid'), 'utf8').split('\n')[0] ?? '';
    } catch {
      return cpu;
    }
    let entries: string[];
    try {
      entries = readdirSync('/proc');
    } catch {
      return cpu;
    }
    for (const entry of entries) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        // The title a backend sets: "postgres: <user> <database> <client> <state>".
        const title = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
        if (!title.includes(` ${name} `)) continue;
        const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
        // Fields after the command name in parentheses: state is field 3, ppid 4, utime 14, stime 15.
        const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
        if (fields[1] !== postmaster) continue;
        cpu.set(Number(entry), ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS);
      } catch {
        // The process ended while we looked.
      }
    }
    return cpu;
  }

  async stop(): Promise<void> {
    await this.embedded.stop();
    await rm(this.dataDir, { recursive: true, force: true });
  }
}

export interface MachineInfo {
  readonly cpu: string;
  readonly cores: number;
  readonly memoryGiB: number;
  readonly node: string;
  readonly postgres: string;
  readonly settings: string;
}
