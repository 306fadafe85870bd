import { spawn, spawnSync } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { newMachine } from '@bmaas/bmdb-model';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { eventually } from '../../../test/support/wait.js';
import { postgresInstallation } from '../src/embedded/installation.js';
import { EmbeddedDatabase } from '../src/embedded.js';
import { BMDB, DatabaseUnreachableError, EmbeddedDatabaseError } from '../src/index.js';

let dataDir: string;

beforeAll(async () => {
  dataDir = await mkdtemp(path.join(tmpdir(), 'bmdb-embedded-'));
});
afterAll(() => rm(dataDir, { recursive: true, force: true }));

const open = (dir = dataDir) =>
  BMDB.open({ embedded: { dataDir: dir }, migrate: true, componentName: 'embedded-test', runtimeInfo: 'vitest' });

function portAccepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.on('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.on('error', () => resolve(false));
  });
}

describe('embedded PostgreSQL', () => {
  test('BMDB.open without a url starts a server under the data directory; close() stops it; data persists', async () => {
    const bmdb = await open();
    const port = bmdb.embedded?.port as number;
    expect(port).toBeGreaterThan(0);
    const session = await bmdb.startSession();
    const machineId = await session.transact((q) => newMachine(q));
    // Its own process group: a terminal's Ctrl-C reaches us, and we stop the server after our clean stop.
    const postmaster = (await readFile(path.join(dataDir, 'pgdata', 'postmaster.pid'), 'utf8')).split('\n')[0];
    const groupOf = (pid: string) => spawnSync('ps', ['-o', 'pgid=', '-p', pid]).stdout.toString().trim();
    expect(groupOf(postmaster ?? '')).not.toBe('');
    expect(groupOf(postmaster ?? '')).not.toBe(groupOf(String(process.pid)));
    await expect(open()).rejects.toBeInstanceOf(EmbeddedDatabaseError);
    await expect(open()).rejects.toThrow(/already in use by this process/);
    await bmdb.close();
    expect(await portAccepts(port)).toBe(false);

    const again = await open();
    const rows = await again.db.selectFrom('machines').select('machine_id').execute();
    expect(rows.map((r) => r.machine_id)).toEqual([machineId]);
    await again.close();
  });

  test('a server orphaned by a dead owner is stopped and started again', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'bmdb-orphan-'));
    try {
      const first = await EmbeddedDatabase.start({ dataDir: dir });
      await first.stop();
      // A previous owner started postgres and died without stopping it.
      const orphan = await startOrphan(path.join(dir, 'pgdata'), first.port);
      expect(await portAccepts(first.port)).toBe(true);
      const deadPid = spawnSync('true').pid;
      await writeFile(path.join(dir, 'owner.pid'), `${deadPid}\n`);

      const bmdb = await open(dir);
      expect(await bmdb.db.selectFrom('machines').select('machine_id').execute()).toEqual([]);
      await bmdb.close();
      expect(orphan.exitCode ?? orphan.signalCode).not.toBeNull(); // the orphan was shut down
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('a server owned by another live process is refused, or attached to when asked', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'bmdb-attach-'));
    const owner = spawn('sleep', ['60'], { stdio: 'ignore' });
    try {
      const first = await EmbeddedDatabase.start({ dataDir: dir });
      await first.stop();
      // Another shepherd process owns the server, which is still starting up: attaching waits for it.
      await writeFile(path.join(dir, 'owner.pid'), `${owner.pid}\n`);
      const server = await startOrphan(path.join(dir, 'pgdata'), first.port, 'started');

      const attached = await EmbeddedDatabase.start({ dataDir: dir, attach: true });
      expect(attached.attached).toBe(true);
      expect(attached.port).toBe(first.port);
      await expect(EmbeddedDatabase.start({ dataDir: dir })).rejects.toThrow(`already in use by process ${owner.pid}`);
      const bmdb = await BMDB.open({
        url: attached.url,
        migrate: true,
        componentName: 'attached',
        runtimeInfo: 'vitest',
      });
      await bmdb.close();
      await attached.stop(); // lets go only
      expect(await portAccepts(first.port)).toBe(true);
      await stopServer(dir, server);
    } finally {
      owner.kill();
      await rm(dir, { recursive: true, force: true });
    }
  });

  const asRoot = process.getuid?.() === 0;
  test.skipIf(!asRoot)(
    'as root, a data directory under a directory only root can enter works (postgres runs as postgres)',
    async () => {
      // /root, or a mktemp -d: the postgres user cannot walk this path.
      const privateDir = await mkdtemp(path.join(tmpdir(), 'bmdb-private-'));
      await chmod(privateDir, 0o700);
      try {
        const bmdb = await open(path.join(privateDir, 'data'));
        const session = await bmdb.startSession();
        await session.transact((q) => newMachine(q));
        expect(await bmdb.db.selectFrom('machines').select('machine_id').execute()).toHaveLength(1);
        await bmdb.close();
      } finally {
        await rm(privateDir, { recursive: true, force: true });
      }
    },
  );

  test('a data directory postgres cannot start from is one EmbeddedDatabaseError naming the cause', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'bmdb-broken-'));
    try {
      // A cluster that is not one: PG_VERSION there, nothing else.
      await mkdir(path.join(dir, 'pgdata'), { mode: 0o700 });
      await writeFile(path.join(dir, 'pgdata', 'PG_VERSION'), '18\n');
      if (asRoot) await chown(path.join(dir, 'pgdata'), ...(await postgresIds()));
      const error = await EmbeddedDatabase.start({ dataDir: dir }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(EmbeddedDatabaseError);
      expect((error as Error).message).toContain(dir);
      expect((error as Error).message).toMatch(/postgres (failed to start|exited)/);
      expect((error as Error).message).toMatch(/postgresql\.conf|No such file/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('open() needs a url or an embedded data directory', async () => {
    await expect(BMDB.open({ migrate: true, componentName: 'x', runtimeInfo: 'y' })).rejects.toThrow(
      /needs either url \(a PostgreSQL URL\) or embedded.dataDir/,
    );
  });

  test('an unreachable database is reported with its URL, password redacted', async () => {
    const attempt = BMDB.open({
      url: 'postgres://shepherd:s3cret@127.0.0.1:1/bmdb',
      migrate: true,
      componentName: 'x',
      runtimeInfo: 'y',
    });
    await expect(attempt).rejects.toBeInstanceOf(DatabaseUnreachableError);
    const error = (await attempt.catch((e: unknown) => e)) as Error;
    expect(error.message).toContain('postgres://shepherd:***@127.0.0.1:1/bmdb');
    expect(error.message).not.toContain('s3cret');
  });
});

async function postgresIds(): Promise<[number, number]> {
  const id = (flag: string) => Number.parseInt(spawnSync('id', [flag, 'postgres']).stdout.toString(), 10);
  return [id('-u'), id('-g')];
}

/** Fast shutdown of a server started by {@link startOrphan}: signal the postmaster itself, not runuser. */
async function stopServer(dir: string, child: ReturnType<typeof spawn>): Promise<void> {
  const pid = Number.parseInt(
    (await readFile(path.join(dir, 'pgdata', 'postmaster.pid'), 'utf8')).split('\n')[0] ?? '',
    10,
  );
  const exited = new Promise((resolve) => child.once('exit', resolve));
  process.kill(pid, 'SIGINT');
  await exited;
}

/** Runs postgres on `pgdata` detached from any EmbeddedDatabase, as a crashed owner would leave it. */
/**
 * Starts postgres on `pgdata` as a process of its own, and waits until it
 * accepts TCP connections, or only until it has `started` (its
 * postmaster.pid names the port; it may still refuse connections, 57P03).
 */
async function startOrphan(pgdata: string, port: number, until: 'accepting' | 'started' = 'accepting') {
  // The binaries the library runs: as root, maybe a copy the postgres user can reach.
  const postgres = path.join((await postgresInstallation()).bin, 'postgres');
  const serverArgs = [
    '-D',
    pgdata,
    '-p',
    String(port),
    '-c',
    'listen_addresses=127.0.0.1',
    '-c',
    'unix_socket_directories=',
  ];
  // As root, postgres must run as the postgres user.
  const [command, args] =
    process.getuid?.() === 0 ? ['runuser', ['-u', 'postgres', '--', postgres, ...serverArgs]] : [postgres, serverArgs];
  const child = spawn(command, args, { stdio: 'ignore' });
  if (until === 'started') {
    await eventually(
      `postgres on port ${port} started`,
      async () => {
        const lines = await readFile(path.join(pgdata, 'postmaster.pid'), 'utf8').then(
          (text) => text.split('\n'),
          () => [],
        );
        return Number.parseInt(lines[3] ?? '', 10) === port ? true : undefined;
      },
      10_000,
      2, // start-up may take no longer than a few milliseconds
    );
    return child;
  }
  await eventually(
    `postgres accepting on port ${port}`,
    async () => ((await portAccepts(port)) ? true : undefined),
    10_000,
  );
  return child;
}
