/**
 * The bundled test agent installs what its heartbeats' answers ask for,
 * against a real BMaaS server and a real HTTPS image server: the image
 * downloaded and verified while streaming, gunzipped, written to the root
 * device (a file the size of a disk), flushed, the outcome reported with its
 * generation, the reboot command run; heartbeats go on while it installs.
 * Every way it fails is an Error shown with its cause, and the machine is
 * asked again and installs. The edges: a hold lets an installation under way
 * finish; a report ignored (a newer request made while it finished) makes it
 * install the newer one instead of rebooting; a Success report whose answer
 * was lost is answered when sent again, and it reboots.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes, X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import {
  addProvided,
  cancelOSInstallation,
  holdMachine,
  newMachine,
  type OSInstallation,
  osInstallation,
  osInstallationReport,
  requestOSInstallation,
  setAgentStarted,
  unholdMachine,
} from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { encodeTakeoverInit, parseTakeoverResponse, type TakeoverInitParams } from '@bmaas/shepherd-manager';
import pg from 'pg';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { ImageServer } from '../../../test/support/image-server.js';
import { agentHeartbeaters, eventually, killQuietly } from './helpers.js';

const TEST_AGENT = path.resolve('packages/shepherd-manager/bin/test-agent.js');
const MiB = 1 << 20;

const { db, bmdb } = await testBMDB();
const q = bmdb.db;
let dir: string;
let server: BmaasServer;
let images: ImageServer;
let caCertificate: Uint8Array;
const image = randomBytes(3 * MiB);
const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'test-agent-install-'));
  const tls = await selfSignedServerTls(path.join(dir, 'tls'));
  caCertificate = new Uint8Array(new X509Certificate(tls.cert).raw);
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  // The image server's certificate is the one the agent was given as its CA.
  images = await ImageServer.start(tls);
  images.serve('debian.img', { bytes: image });
  images.serve('debian.img.gz', { bytes: gzipSync(image), chunkBytes: 128 * 1024, chunkDelayMs: 100 });
});
afterAll(async () => {
  for (const pid of (await agentHeartbeaters(db)).values()) killQuietly(pid);
  await server?.close();
  await images?.close();
  await rm(dir, { recursive: true, force: true });
});

/**
 * A machine whose test agent was taken over as the initializer does it, and
 * its disk: a file of `diskBytes`. Returns the machine ID, the disk's path
 * and the agent's log.
 */
async function machineWithAgent(
  name: string,
  diskBytes = 8 * MiB,
): Promise<{ machineId: string; disk: string; log: () => Promise<string> }> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Install', providerId: name });
  const disk = path.join(dir, `${name}.disk`);
  await writeFile(disk, '');
  await truncate(disk, diskBytes);
  const logPath = path.join(dir, `${name}.log`);
  const init: TakeoverInitParams = { machineId, bmaasEndpoint: `127.0.0.1:${server.port}`, caCertificate };
  const answer = await new Promise<Buffer>((resolve, reject) => {
    const child = spawn(process.execPath, [TEST_AGENT], {
      stdio: 'pipe',
      env: {
        ...process.env,
        SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: '200ms',
        SHEPHERD_TEST_AGENT_LOG: logPath,
        SHEPHERD_TEST_AGENT_REBOOT_COMMAND: `echo "$PPID" > ${path.join(dir, `${name}.rebooted`)}`,
        SHEPHERD_TEST_AGENT_USER_DATA_DIR: dir,
      },
    });
    const stdout: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(stdout)) : reject(new Error(`exit ${code}`))));
    child.stdin.end(encodeTakeoverInit(init));
  });
  const { key } = parseTakeoverResponse(answer, init);
  await setAgentStarted(q, machineId, { publicKey: key });
  return { machineId, disk, log: () => readFile(logPath, 'utf8').catch(() => '') };
}

const request = (machineId: string, change: Partial<Parameters<typeof requestOSInstallation>[2]> = {}) =>
  requestOSInstallation(q, machineId, {
    imageUrl: images.url('debian.img'),
    imageSha256: sha256(image),
    rootDevice: '/nonexistent',
    actor: 'test',
    reason: 'agent test',
    ...change,
  });

/** Waits until the machine's request of `generation` settled (Succeeded or Failed), and returns it. */
async function settled(machineId: string, generation: bigint, log: () => Promise<string>): Promise<OSInstallation> {
  try {
    return await eventually(async () => {
      const installation = await osInstallation(q, machineId);
      return installation?.generation === generation &&
        (installation.state === 'Succeeded' || installation.state === 'Failed')
        ? installation
        : undefined;
    }, 60_000);
  } catch (error) {
    throw new Error(`${(error as Error).message}\nagent log:\n${await log()}`);
  }
}

const heartbeatAt = async (machineId: string) =>
  (await db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rows[0]
    ?.agent_heartbeat_at as Date | undefined;

test('installs a gzipped image over HTTPS while heartbeating: verified, written, flushed, reported, rebooted', async () => {
  const { machineId, disk, log } = await machineWithAgent('good');
  await eventually(() => heartbeatAt(machineId));
  const asked = await request(machineId, {
    imageUrl: images.url('debian.img.gz'),
    imageSha256: sha256(gzipSync(image)),
    compression: 'gzip',
    rootDevice: disk,
    userData: Buffer.from('#cloud-config\nhostname: good\n'),
  });
  // The slow download takes seconds: heartbeats go on meanwhile, the request Delivered.
  const delivered = await eventually(async () => (await osInstallation(q, machineId))?.deliveredAt ?? undefined);
  await eventually(async () => {
    const installation = await osInstallation(q, machineId);
    const at = await heartbeatAt(machineId);
    return installation?.state === 'Delivered' && at && at.getTime() > delivered.getTime() + 300 ? true : undefined;
  });
  const done = await settled(machineId, asked.generation, log);
  expect(done).toMatchObject({ state: 'Succeeded', error: null });
  const written = await readFile(disk);
  expect(written.length).toBe(8 * MiB);
  expect(written.subarray(0, image.length).equals(image)).toBe(true);
  expect(written.subarray(image.length).every((byte) => byte === 0)).toBe(true);
  expect(await readFile(path.join(dir, `${machineId}.user-data`), 'utf8')).toBe('#cloud-config\nhostname: good\n');
  // The reboot command ran, and the agent stopped: the machine runs its OS now.
  await eventually(async () => await readFile(path.join(dir, 'good.rebooted'), 'utf8').catch(() => undefined));
  await eventually(async () => ((await log()).endsWith('stopped\n') ? true : undefined));
  const throughput = /(\d+) bytes written and flushed in ([\d.]+) s \(([\d.]+) MB\/s\)/.exec(await log());
  expect(throughput).not.toBeNull();
  console.log(
    `test agent: ${throughput?.[1]} bytes (gzip, throttled to ~1.3 MB/s by the image server) in ${throughput?.[2]} s; load ${loadavg()[0]?.toFixed(2)}`,
  );
});

test('every failure is an Error with its cause; the agent keeps heartbeating and installs when asked again', async () => {
  const { machineId, disk, log } = await machineWithAgent('retried');
  await truncate(path.join(dir, 'small.disk'), MiB).catch(async () => {
    await writeFile(path.join(dir, 'small.disk'), '');
    await truncate(path.join(dir, 'small.disk'), MiB);
  });
  const { cert: otherCert, key: otherKey } = await selfSignedServerTls(path.join(dir, 'other-tls'));
  const untrusted = await ImageServer.start({ cert: otherCert, key: otherKey });
  untrusted.serve('debian.img', { bytes: image });
  try {
    const failures: [Partial<Parameters<typeof requestOSInstallation>[2]>, RegExp][] = [
      [{ rootDevice: disk, imageSha256: 'ab'.repeat(32) }, /sha256 mismatch: downloaded [0-9a-f]{64}, want (ab){32}/],
      [{ rootDevice: disk, imageUrl: images.url('missing.img') }, /HTTP status 404/],
      [{ rootDevice: path.join(dir, 'no-such-disk') }, /root device .*no-such-disk missing/],
      [{ rootDevice: path.join(dir, 'small.disk') }, /small\.disk too small: 1048576 bytes/],
      [{ rootDevice: disk, imageUrl: untrusted.url('debian.img') }, /certificate/],
    ];
    for (const [change, cause] of failures) {
      const asked = await request(machineId, change);
      const failed = await settled(machineId, asked.generation, log);
      expect(failed.state, JSON.stringify(change)).toBe('Failed');
      expect(failed.error).toMatch(cause);
      // A failed write leaves no image that could boot: the disk's first MiB is zeros.
      expect((await readFile(disk)).subarray(0, MiB).every((byte) => byte === 0)).toBe(true);
    }
    // Still heartbeating, and asked again with the right request it installs.
    const before = await heartbeatAt(machineId);
    await eventually(
      async () => ((await heartbeatAt(machineId))?.getTime() ?? 0) > (before?.getTime() ?? 0) || undefined,
    );
    const asked = await request(machineId, { rootDevice: disk });
    expect(asked.generation).toBe(BigInt(failures.length + 1));
    expect(await settled(machineId, asked.generation, log)).toMatchObject({ state: 'Succeeded' });
    expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
  } finally {
    await untrusted.close();
  }
});

test('a canceled request stops the installation under way; asked again, it installs', async () => {
  const { machineId, disk, log } = await machineWithAgent('canceled');
  images.serve('slow.img', { bytes: image, chunkBytes: 64 * 1024, chunkDelayMs: 200 });
  await request(machineId, { imageUrl: images.url('slow.img'), rootDevice: disk });
  await eventually(async () => ((await osInstallation(q, machineId))?.state === 'Delivered' ? true : undefined));
  await eventually(async () => (images.requests.includes('slow.img') ? true : undefined));
  await cancelOSInstallation(q, machineId, { actor: 'test', reason: 'wrong image' });
  await eventually(async () => ((await log()).includes('no longer asked for: stopping it') ? true : undefined));
  await eventually(async () => (images.brokenOff.includes('slow.img') ? true : undefined));
  expect((await osInstallation(q, machineId))?.state).toBe('Canceled');
  const asked = await request(machineId, { rootDevice: disk });
  expect(await settled(machineId, asked.generation, log)).toMatchObject({ state: 'Succeeded' });
});

/** A promise and the function that resolves it: a download's last chunk, let go when the test says. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open = () => {};
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { opened, open };
}

test('a hold lets the installation under way finish: its agent is still answered the request, installs and reboots', async () => {
  const { machineId, disk, log } = await machineWithAgent('held');
  const last = gate();
  images.serve('held.img', { bytes: image, chunkBytes: 256 * 1024, lastChunkAfter: last.opened });
  const asked = await request(machineId, { imageUrl: images.url('held.img'), rootDevice: disk });
  await eventually(async () => ((await osInstallation(q, machineId))?.state === 'Delivered' ? true : undefined));
  await eventually(async () => (images.requests.includes('held.img') ? true : undefined));
  await holdMachine(q, machineId, { reason: 'rack work next door', actor: 'test' });
  // A heartbeat whose statement began after the hold: its answer was made under it.
  const heldSince = (await db.admin('SELECT now() AS now')).rows[0].now as Date;
  await eventually(async () => ((await heartbeatAt(machineId))?.getTime() ?? 0) > heldSince.getTime() || undefined);
  last.open();
  expect(await settled(machineId, asked.generation, log)).toMatchObject({ state: 'Succeeded' });
  expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
  expect(await log()).not.toContain('no longer asked for');
  expect(images.brokenOff).not.toContain('held.img');
  await eventually(async () => await readFile(path.join(dir, 'held.rebooted'), 'utf8').catch(() => undefined));
  await unholdMachine(q, machineId, { actor: 'test' });
});

test('a Success report of a request replaced while it finished is ignored: the agent installs the newer one instead of rebooting', async () => {
  const { machineId, disk, log } = await machineWithAgent('replaced');
  const older = randomBytes(2 * MiB);
  const last = gate();
  images.serve('older.img', { bytes: older, chunkBytes: 256 * 1024, lastChunkAfter: last.opened });
  const first = await request(machineId, {
    imageUrl: images.url('older.img'),
    imageSha256: sha256(older),
    rootDevice: disk,
  });
  await eventually(async () => ((await osInstallation(q, machineId))?.state === 'Delivered' ? true : undefined));
  await eventually(async () => (images.requests.includes('older.img') ? true : undefined));
  // The agent's next heartbeat waits on its AgentStarted row, its statement begun before the newer request:
  // it answers the older one, so the agent finishes it and reports it with the heartbeat after.
  const blocker = new pg.Client({ connectionString: db.url });
  await blocker.connect();
  let newer: OSInstallation;
  try {
    await blocker.query('BEGIN');
    await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [machineId]);
    await eventually('a heartbeat waiting on the AgentStarted row', async () => {
      const { rowCount } = await db.admin(
        `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      return rowCount ? true : undefined;
    });
    newer = await request(machineId, { rootDevice: disk });
    last.open();
    await eventually(async () =>
      (await log()).includes(`installed generation ${first.generation}:`) ? true : undefined,
    );
    await blocker.query('COMMIT');
  } finally {
    await blocker.end();
  }
  await eventually(async () =>
    (await log()).includes(`installation report of generation ${first.generation} ignored`) ? true : undefined,
  );
  expect(await settled(machineId, newer.generation, log)).toMatchObject({ state: 'Succeeded' });
  // The newer image is on the disk, and the agent rebooted once, into it.
  expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
  await eventually(async () => ((await log()).endsWith('stopped\n') ? true : undefined));
  const lines = (await log()).split('\n');
  expect(lines.filter((line) => line.includes('rebooting')).length).toBe(1);
  expect(lines.findIndex((line) => line.includes(`generation ${newer.generation} accepted`))).toBeGreaterThan(
    lines.findIndex((line) => line.includes(`generation ${first.generation} ignored`)),
  );
  expect(await osInstallationReport(q, machineId)).toMatchObject({ generation: newer.generation, result: 'Success' });
});

test('a Success report whose answer was lost (the agent gave up waiting while it committed) is answered when sent again: the agent reboots', async () => {
  const { machineId, disk, log } = await machineWithAgent('lost');
  const last = gate();
  images.serve('lost.img', { bytes: image, chunkBytes: 256 * 1024, lastChunkAfter: last.opened });
  const asked = await request(machineId, { imageUrl: images.url('lost.img'), rootDevice: disk });
  await eventually(async () => ((await osInstallation(q, machineId))?.state === 'Delivered' ? true : undefined));
  await eventually(async () => (images.requests.includes('lost.img') ? true : undefined));
  // Every heartbeat of the machine waits on its AgentStarted row, so the agent's calls time out (10 s each):
  // the one waiting as the installation ends, then the one carrying its Success report.
  const blocker = new pg.Client({ connectionString: db.url });
  await blocker.connect();
  try {
    await blocker.query('BEGIN');
    await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [machineId]);
    await eventually('a heartbeat waiting on the AgentStarted row', async () => {
      const { rowCount } = await db.admin(
        `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      return rowCount ? true : undefined;
    });
    last.open();
    const failuresAfterInstall = async () => {
      const text = await log();
      const installed = text.indexOf(`installed generation ${asked.generation}:`);
      return installed < 0 ? 0 : text.slice(installed).split('heartbeat failed').length - 1;
    };
    await eventually(async () => ((await failuresAfterInstall()) >= 2 ? true : undefined), 60_000);
    await blocker.query('COMMIT');
  } finally {
    await blocker.end();
  }
  // The report sent while the row was locked is stored once the lock goes, its answer lost: the agent sends it again.
  expect(await settled(machineId, asked.generation, log)).toMatchObject({ state: 'Succeeded' });
  await eventually(async () => await readFile(path.join(dir, 'lost.rebooted'), 'utf8').catch(() => undefined));
  await eventually(async () => ((await log()).endsWith('stopped\n') ? true : undefined));
  expect(await log()).toContain(`installation report of generation ${asked.generation} accepted`);
  expect(await log()).not.toMatch(/gRPC status 16/);
}, 120_000);
