import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { TestProject } from 'vitest/node';
// By path: global setups resolve outside the test environment's export conditions.
import { EmbeddedDatabase } from '../packages/bmdb-controlloop/src/embedded.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of a database on the test server with rights to create databases. */
    bmdbAdminUrl: string;
  }
}

/**
 * Tests talk to a real PostgreSQL: `BMDB_TEST_URL` when set, else one
 * throwaway embedded server for the whole run. Each test file creates its own
 * database on it (test/support/database.ts), so files run in parallel.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // Every project runs this setup; they share one server, stopped by the last.
  shared.users++;
  shared.server ??= startServer();
  project.provide('bmdbAdminUrl', (await shared.server).url);
  return async () => {
    if (--shared.users > 0) return;
    await (await shared.server)?.stop();
    shared.server = undefined;
  };
}

interface TestServer {
  url: string;
  stop(): Promise<void>;
}

interface SharedServer {
  users: number;
  server?: Promise<TestServer> | undefined;
}

const key = Symbol.for('shepherd-ts.test-server');
const registry = globalThis as Record<symbol, SharedServer | undefined>;
const shared: SharedServer = registry[key] ?? { users: 0 };
registry[key] = shared;

async function startServer(): Promise<TestServer> {
  const external = process.env.BMDB_TEST_URL;
  if (external) return { url: external, stop: async () => {} };
  const dataDir = await mkdtemp(path.join(tmpdir(), 'bmdb-test-'));
  const server = await EmbeddedDatabase.start({
    dataDir,
    database: 'postgres',
    // Throwaway data: trade durability for speed, and allow every file's pools.
    postgresFlags: [
      '-c',
      'fsync=off',
      '-c',
      'synchronous_commit=off',
      '-c',
      'full_page_writes=off',
      '-c',
      'max_connections=400',
    ],
  });
  return {
    url: server.url,
    stop: async () => {
      await server.stop();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}
