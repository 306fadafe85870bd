import { randomBytes } from 'node:crypto';
import { BMDB, type BMDBOptions } from '@bmaas/bmdb-controlloop';
import pg from 'pg';
import { afterAll, inject } from 'vitest';
import { eventually } from './wait.js';

/** A database of one test file's own, dropped after the file's tests. */
export interface TestDatabase {
  readonly name: string;
  readonly url: string;
  /** Runs SQL as the server's superuser against this database (for moving time, faults). */
  admin(text: string, values?: unknown[]): Promise<pg.QueryResult>;
}

/**
 * Creates a fresh database for the calling test file and registers its
 * removal. Call at module level or in `beforeAll`.
 */
export async function createTestDatabase(): Promise<TestDatabase> {
  const adminUrl = inject('bmdbAdminUrl');
  const name = `bmdb_test_${randomBytes(6).toString('hex')}`;
  await withClient(adminUrl, (client) => client.query(`CREATE DATABASE ${name}`));
  const url = withDatabase(adminUrl, name);
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  pool.on('error', () => {});
  afterAll(async () => {
    await pool.end();
    await withClient(adminUrl, (client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
  });
  return { name, url, admin: (text, values) => pool.query(text, values) };
}

/** Opens a BMDB on `db`, migrated, closed after the file's tests. */
export async function openTestBMDB(db: TestDatabase, options: Partial<BMDBOptions> = {}): Promise<BMDB> {
  const bmdb = await BMDB.open({
    url: db.url,
    migrate: true,
    componentName: 'test',
    runtimeInfo: 'vitest',
    ...options,
  });
  afterAll(() => bmdb.close());
  return bmdb;
}

/**
 * A database of the calling test file's own and a BMDB open on it, migrated
 * (with `options`), both gone after the file's tests. Await it at the file's
 * top level: `const { db, bmdb } = await testBMDB();`.
 */
export async function testBMDB(
  options: Partial<BMDBOptions> = {},
): Promise<{ readonly db: TestDatabase; readonly bmdb: BMDB }> {
  const db = await createTestDatabase();
  return { db, bmdb: await openTestBMDB(db, options) };
}

/**
 * Waits until some session of `db`'s server waits for an advisory lock: a
 * statement under test has reached its lock and blocks there.
 */
export async function waitForAdvisoryLockWaiter(db: TestDatabase): Promise<void> {
  await eventually('a session waiting for an advisory lock', async () => {
    const { rowCount } = await db.admin(`SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`);
    return rowCount ? true : undefined;
  });
}

/** `url` pointing at another database on the same server. */
export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

async function withClient<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}
