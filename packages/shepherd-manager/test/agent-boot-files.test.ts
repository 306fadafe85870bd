/**
 * The agent boot files over a real server on 127.0.0.1, plain and over real
 * TLS, on a real BMDB: the image's files in ranges (as BMCs fetch ISOs), each
 * virtual media boot's ISO holding its machine's enrollment (never answered
 * by MAC), each network boot armed in the BMDB answered by MAC by every
 * process's boot files and its config served once, with a token minted then,
 * a boot forgotten by its own capability, and no capability or token in the
 * log. The image is a small ISO made here with xorriso (isolinux's boot
 * record in it, as the real image has), so no 50 MiB image is built.
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { copyFile, mkdir, mkdtemp, readdir, readFile, readlink, rm, stat, truncate, writeFile } from 'node:fs/promises';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import {
  agentEnrollment,
  armNetworkBoot,
  EnrollmentRefusedError,
  endNetworkBoot,
  enrollAgent,
  networkBootState,
  newMachine,
  operatorHistory,
  Process,
  revokeEnrollmentToken,
  setAgentHeartbeat,
} from '@bmaas/bmdb-model';
import { certificatePem, Secret, selfSignedCertificate } from '@bmaas/common';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { smallAgentImage } from '../../../test/support/agent-image.js';
import { testBMDB } from '../../../test/support/database.js';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { eventually } from '../../../test/support/wait.js';
import {
  AgentBootFiles,
  AgentBootFilesError,
  type AgentBootFilesOptions,
  type AgentBootRequest,
} from '../src/index.js';

const run = promisify(execFile);
const { bmdb } = await testBMDB();
const q = bmdb.db;

let dir: string;
let imageDir: string;
let files: AgentBootFiles;
/** What the image directory holds, byte for byte. */
const image: Record<'vmlinuz' | 'initramfs', Buffer> = {
  vmlinuz: randomBytes(1_000_003),
  initramfs: randomBytes(300_001),
};

interface Answer {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly body: Buffer;
}

/** One HTTP/1.1 request, as a BMC or iPXE makes it; `ca` for HTTPS. */
function fetchRaw(url: string, options: { method?: string; headers?: Record<string, string>; ca?: string } = {}) {
  return new Promise<Answer>((resolve, reject) => {
    const send = url.startsWith('https:') ? httpsRequest : httpRequest;
    const request = send(
      url,
      { method: options.method ?? 'GET', headers: options.headers, ca: options.ca, agent: false },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () =>
          resolve({ status: response.statusCode ?? 0, headers: response.headers, body: Buffer.concat(chunks) }),
        );
        response.on('error', reject);
      },
    );
    request.on('error', reject);
    request.end();
  });
}

/** The files of a newc cpio archive: path → mode and bytes. */
function parseCpio(archive: Buffer): Map<string, { mode: number; data: Buffer }> {
  const entries = new Map<string, { mode: number; data: Buffer }>();
  const align = (n: number) => Math.ceil(n / 4) * 4;
  let offset = 0;
  for (;;) {
    expect(archive.subarray(offset, offset + 6).toString('ascii')).toBe('070701');
    const field = (i: number) =>
      Number.parseInt(archive.subarray(offset + 6 + i * 8, offset + 14 + i * 8).toString('ascii'), 16);
    const [mode, size, nameSize] = [field(1), field(6), field(11)];
    const nameStart = offset + 110;
    const name = archive.subarray(nameStart, nameStart + nameSize - 1).toString('utf8');
    const dataStart = align(nameStart + nameSize);
    if (name === 'TRAILER!!!') return entries;
    entries.set(name, { mode, data: archive.subarray(dataStart, dataStart + size) });
    offset = align(dataStart + size);
  }
}

/** `/etc/bmaas/enrollment.json` of a config archive, and its mode. */
function enrollmentOf(archive: Buffer) {
  const file = parseCpio(archive).get('etc/bmaas/enrollment.json');
  expect(file).toBeDefined();
  const json = JSON.parse(file?.data.toString('utf8') ?? '{}') as { init: string; token: string };
  return {
    mode: (file?.mode ?? 0) & 0o7777,
    init: fromBinary(TakeoverInitSchema, Buffer.from(json.init, 'base64')),
    token: json.token,
  };
}

function bootOf(machineId = randomUUID()): AgentBootRequest {
  return {
    machineId,
    init: create(TakeoverInitSchema, { machineId, bmaasEndpoint: 'bmaas.example:4443' }),
    token: new Secret(randomBytes(24).toString('base64url')),
  };
}

/** A machine the agent booter holds a claim on, as its loop does: a live session and its work row. */
async function claimedMachine(): Promise<{ machineId: string; sessionId: string }> {
  const machineId = await newMachine(q);
  const { session_id: sessionId } = await q
    .insertInto('sessions')
    .values({
      component_name: 'test',
      runtime_info: 'agent boot files test',
      interval_seconds: 3600,
      deadline: sql<Date>`now() + interval '1 hour'`,
    })
    .returning('session_id')
    .executeTakeFirstOrThrow();
  await q
    .insertInto('work')
    .values({ machine_id: machineId, session_id: sessionId, process: Process.ShepherdAgentBoot })
    .execute();
  return { machineId, sessionId };
}

/** A network boot armed for a claimed machine, as the agent booter arms it. */
async function armedBoot(macs: readonly string[]) {
  const { machineId, sessionId } = await claimedMachine();
  const bootId = randomUUID();
  const capability = randomBytes(32).toString('base64url');
  await armNetworkBoot(q, {
    machineId,
    bootId,
    capability,
    macs,
    takeoverInit: toBinary(
      TakeoverInitSchema,
      create(TakeoverInitSchema, { machineId, bmaasEndpoint: 'bmaas.example:4443' }),
    ),
    agentFlags: ['--interval=3000ms'],
    tokenValidForSeconds: 120,
  });
  return { machineId, sessionId, bootId, capability };
}

/** The URL in the script's `initrd` line of this boot's config. */
function configUrlOf(script: string): string {
  const url = /^initrd (\S+\/config\.cpio)$/m.exec(script)?.[1];
  expect(url).toBeDefined();
  return url ?? '';
}

/** The per-boot directories under `workDir`'s server directory. */
async function bootDirs(workDir: string): Promise<string[]> {
  const [server] = await readdir(workDir);
  return server === undefined ? [] : readdir(path.join(workDir, server));
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-boot-files-'));
  imageDir = await smallAgentImage(dir, image);
  files = await AgentBootFiles.start({
    imageDir,
    db: q,
    workDir: path.join(dir, 'work'),
    listen: { host: '127.0.0.1', port: 0 },
  });
});

afterAll(async () => {
  await files?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('the image files', () => {
  test('a GET answers the whole file with its length, an ETag and Accept-Ranges; a HEAD the same without a body', async () => {
    const url = `${files.url}/agent-boot/vmlinuz`;
    const got = await fetchRaw(url);
    expect(got.status).toBe(200);
    expect(got.body.equals(image.vmlinuz)).toBe(true);
    expect(got.headers['content-length']).toBe(String(image.vmlinuz.length));
    expect(got.headers['accept-ranges']).toBe('bytes');
    expect(got.headers.etag).toMatch(/^"[0-9a-z-]+"$/);
    const head = await fetchRaw(url, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.body.length).toBe(0);
    expect(head.headers['content-length']).toBe(String(image.vmlinuz.length));
    expect(head.headers.etag).toBe(got.headers.etag);
    const iso = await fetchRaw(`${files.url}/agent-boot/agent.iso`, { method: 'HEAD' });
    expect(iso.headers['content-length']).toBe(String((await stat(path.join(imageDir, 'agent.iso'))).size));
    expect(iso.headers['content-type']).toBe('application/x-iso9660-image');
  });

  test('a range is answered 206 with Content-Range: the first bytes, a suffix, an open end, one past the end clipped', async () => {
    const url = `${files.url}/agent-boot/initramfs`;
    const size = image.initramfs.length;
    const cases = [
      { range: 'bytes=0-2047', first: 0, last: 2047 },
      { range: 'bytes=-1000', first: size - 1000, last: size - 1 },
      { range: 'bytes=299990-', first: 299_990, last: size - 1 },
      { range: 'bytes=100-999999999', first: 100, last: size - 1 },
      { range: `bytes=${size - 1}-${size - 1}`, first: size - 1, last: size - 1 },
    ];
    for (const { range, first, last } of cases) {
      const got = await fetchRaw(url, { headers: { range } });
      expect(got.status, range).toBe(206);
      expect(got.headers['content-range'], range).toBe(`bytes ${first}-${last}/${size}`);
      expect(got.headers['content-length'], range).toBe(String(last - first + 1));
      expect(got.body.equals(image.initramfs.subarray(first, last + 1)), range).toBe(true);
    }
    // A suffix longer than the file is the whole file, as a range.
    const longSuffix = await fetchRaw(url, { headers: { range: `bytes=-${size + 10}` } });
    expect(longSuffix.status).toBe(206);
    expect(longSuffix.body.equals(image.initramfs)).toBe(true);
  });

  test('a range past the end is 416 naming the size; several ranges, or one that is not, get the whole file', async () => {
    const url = `${files.url}/agent-boot/initramfs`;
    const size = image.initramfs.length;
    for (const range of [`bytes=${size}-`, `bytes=${size + 5}-${size + 10}`, 'bytes=-0']) {
      const got = await fetchRaw(url, { headers: { range } });
      expect(got.status, range).toBe(416);
      expect(got.headers['content-range'], range).toBe(`bytes */${size}`);
    }
    for (const range of ['bytes=0-9,20-29', 'bytes=9-0', 'items=0-9', 'bytes=abc']) {
      const got = await fetchRaw(url, { headers: { range } });
      expect(got.status, range).toBe(200);
      expect(got.body.equals(image.initramfs), range).toBe(true);
    }
    // HEAD describes the whole file: ranges are a GET's.
    const head = await fetchRaw(url, { method: 'HEAD', headers: { range: 'bytes=0-9' } });
    expect(head.status).toBe(200);
  });

  test('If-Range with the current ETag gets the range; once the file changed, the old ETag gets the whole new file', async () => {
    const ownDir = path.join(dir, 'if-range-image');
    await mkdir(ownDir);
    for (const file of ['vmlinuz', 'initramfs', 'agent.iso'])
      await copyFile(path.join(imageDir, file), path.join(ownDir, file));
    const own = await AgentBootFiles.start({
      imageDir: ownDir,
      db: q,
      workDir: path.join(dir, 'work-if-range'),
      listen: { host: '127.0.0.1', port: 0 },
    });
    try {
      const url = `${own.url}/agent-boot/vmlinuz`;
      const { etag } = (await fetchRaw(url, { method: 'HEAD' })).headers;
      expect(etag).toBeDefined();
      const current = await fetchRaw(url, { headers: { range: 'bytes=0-99', 'if-range': etag ?? '' } });
      expect(current.status).toBe(206);
      expect(current.body.equals(image.vmlinuz.subarray(0, 100))).toBe(true);
      const rebuilt = randomBytes(image.vmlinuz.length + 7);
      await writeFile(path.join(ownDir, 'vmlinuz'), rebuilt);
      const stale = await fetchRaw(url, { headers: { range: 'bytes=0-99', 'if-range': etag ?? '' } });
      expect(stale.status).toBe(200);
      expect(stale.headers.etag).not.toBe(etag);
      expect(stale.body.equals(rebuilt)).toBe(true);
      // A date is no strong validator here: the whole file.
      const dated = await fetchRaw(url, { headers: { range: 'bytes=0-99', 'if-range': new Date().toUTCString() } });
      expect(dated.status).toBe(200);
    } finally {
      await own.close();
    }
  });

  test('a request target that is no path is 400, a full URL is taken as its path, and the server serves on', async () => {
    const statusOf = (target: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(files.port, '127.0.0.1', () =>
          socket.write(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`),
        );
        let text = '';
        socket.on('data', (chunk: Buffer) => {
          text += chunk.toString('latin1');
        });
        socket.on('end', () => resolve(text.split('\r\n')[0] ?? ''));
        socket.on('error', reject);
      });
    expect(await statusOf('*')).toBe('HTTP/1.1 400 Bad Request');
    expect(await statusOf('//[')).toBe('HTTP/1.1 400 Bad Request');
    expect(await statusOf('http://[/agent-boot/vmlinuz')).toBe('HTTP/1.1 400 Bad Request');
    expect(await statusOf('http://shepherd.example/agent-boot/ipxe?mac=02:00:00:00:00:01')).toBe('HTTP/1.1 200 OK');
    expect((await fetchRaw(`${files.url}/agent-boot/initramfs`)).status).toBe(200);
  });

  test('a path that is not served is 404, a method other than GET and HEAD 405', async () => {
    expect((await fetchRaw(`${files.url}/agent-boot/takeover`)).status).toBe(404);
    expect((await fetchRaw(`${files.url}/agent-boot/../etc/passwd`)).status).toBe(404);
    expect((await fetchRaw(`${files.url}/agent-boot/b/${'A'.repeat(43)}/agent.iso`)).status).toBe(404);
    const post = await fetchRaw(`${files.url}/agent-boot/vmlinuz`, { method: 'POST' });
    expect(post.status).toBe(405);
    expect(post.headers.allow).toBe('GET, HEAD');
  });
});

describe('a virtual media boot', () => {
  test('its ISO is the image’s with its machine’s enrollment as /boot/config.cpio, boot record kept; no config is served apart', async () => {
    const boot = bootOf();
    const prepared = await files.prepare(boot);
    expect(prepared.isoUrl).toMatch(new RegExp(`^${files.url}/agent-boot/b/[A-Za-z0-9_-]{43}/agent\\.iso$`));
    expect(prepared.isoUrl).toBe(`${files.url}/agent-boot/b/${prepared.capability}/agent.iso`);

    const iso = await fetchRaw(prepared.isoUrl);
    expect(iso.status).toBe(200);
    expect(iso.headers['cache-control']).toBe('no-store');
    const isoFile = path.join(dir, 'fetched.iso');
    await writeFile(isoFile, iso.body);
    const extracted = path.join(dir, 'extracted.cpio');
    await run('xorriso', ['-osirrox', 'on', '-indev', isoFile, '-extract', '/boot/config.cpio', extracted]);
    const config = await readFile(extracted);
    const enrollment = enrollmentOf(config);
    expect(enrollment.token).toBe(boot.token.reveal());
    expect(enrollment.init.machineId).toBe(boot.machineId);
    expect(enrollment.init.bmaasEndpoint).toBe('bmaas.example:4443');
    expect(enrollment.mode).toBe(0o600);
    const { stdout } = await run('xorriso', ['-indev', isoFile, '-report_el_torito', 'plain']);
    expect(stdout).toMatch(/BIOS\s+y/);
    // The rest of the image is there, unchanged.
    await run('xorriso', ['-osirrox', 'on', '-indev', isoFile, '-extract', '/boot/vmlinuz', path.join(dir, 'vmlinuz')]);
    expect((await readFile(path.join(dir, 'vmlinuz'))).equals(image.vmlinuz)).toBe(true);

    // The token is in the ISO alone: neither a config nor a script is served under the boot's path.
    for (const name of ['config.cpio', 'script.ipxe']) {
      expect((await fetchRaw(prepared.isoUrl.replace(/agent\.iso$/, name))).status, name).toBe(404);
    }
    // The ISO in pieces, as a BMC reads it.
    const piece = await fetchRaw(prepared.isoUrl, { headers: { range: 'bytes=32768-34815' } });
    expect(piece.status).toBe(206);
    expect(piece.body.equals(iso.body.subarray(32768, 34816))).toBe(true);
    await files.forget(prepared);
  });

  test('its ISO is mode 0600 in the work directory, and a forgotten boot’s files are gone from it', async () => {
    const workDir = path.join(dir, 'work-modes');
    const own = await AgentBootFiles.start({ imageDir, db: q, workDir, listen: { host: '127.0.0.1', port: 0 } });
    try {
      const prepared = await own.prepare(bootOf());
      const [serverDir = ''] = await readdir(workDir);
      expect((await stat(path.join(workDir, serverDir))).mode & 0o777).toBe(0o700);
      const [bootDir = ''] = await bootDirs(workDir);
      const names = (await readdir(path.join(workDir, serverDir, bootDir))).sort();
      expect(names).toEqual(['agent.iso']);
      expect((await stat(path.join(workDir, serverDir, bootDir, 'agent.iso'))).mode & 0o777).toBe(0o600);
      await own.forget(prepared);
      expect(await bootDirs(workDir)).toEqual([]);
      await own.prepare(bootOf());
    } finally {
      await own.close();
    }
    expect(await readdir(workDir)).toEqual([]);
  });

  test('two boots of one machine are each forgotten by their own capability: forgetting the older leaves the newer served', async () => {
    const machineId = randomUUID();
    const older = await files.prepare(bootOf(machineId));
    const newer = await files.prepare(bootOf(machineId));
    expect(newer.isoUrl).not.toBe(older.isoUrl);
    expect((await fetchRaw(older.isoUrl, { method: 'HEAD' })).status).toBe(200);
    // The older boot's task ends late (its claim was lost): its end must not reach the newer boot.
    await files.forget(older);
    expect((await fetchRaw(older.isoUrl, { method: 'HEAD' })).status).toBe(404);
    expect((await fetchRaw(newer.isoUrl, { method: 'HEAD' })).status).toBe(200);
    await files.forget(newer);
    expect((await fetchRaw(newer.isoUrl, { method: 'HEAD' })).status).toBe(404);
    await files.forget(newer); // twice: nothing to do
  });

  test('a closed server prepares nothing', async () => {
    const own = await AgentBootFiles.start({
      imageDir,
      db: q,
      workDir: path.join(dir, 'work-closed'),
      listen: { host: '127.0.0.1', port: 0 },
    });
    await own.close();
    const error = await own.prepare(bootOf()).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(AgentBootFilesError);
    expect((error as Error).message).toMatch(/^machine [0-9a-f-]{36}: agent boot files are closed$/);
  });
});

describe('a network boot', () => {
  let other: AgentBootFiles;
  beforeAll(async () => {
    // A second shepherd process's boot files on the same BMDB.
    other = await AgentBootFiles.start({
      imageDir,
      db: q,
      workDir: path.join(dir, 'work-other'),
      listen: { host: '127.0.0.1', port: 0 },
    });
  });
  afterAll(() => other?.close());

  test('its script is answered by any of its MACs, by every process’s boot files, each with its own URLs', async () => {
    const boot = await armedBoot(['52:54:00:12:34:56', '52:54:00:ab:cd:ef']);
    for (const server of [files, other]) {
      const script = (await fetchRaw(`${server.url}/agent-boot/ipxe?mac=52:54:00:12:34:56`)).body.toString('utf8');
      expect(script.split('\n')).toEqual([
        '#!ipxe',
        `kernel ${server.url}/agent-boot/vmlinuz console=tty0 console=ttyS0,115200 panic=10`,
        `initrd ${server.url}/agent-boot/initramfs`,
        `initrd ${server.url}/agent-boot/b/${boot.capability}/config.cpio`,
        'boot',
        '',
      ]);
      for (const mac of ['52-54-00-12-34-56', '52:54:00:AB:CD:EF', '52-54-00-ab-cd-ef']) {
        const got = await fetchRaw(`${server.url}/agent-boot/ipxe?mac=${mac}`);
        expect(got.status, mac).toBe(200);
        expect(got.body.toString('utf8'), mac).toBe(script);
      }
      expect((await fetchRaw(`${server.url}/agent-boot/b/${boot.capability}/script.ipxe`)).body.toString()).toBe(
        script,
      );
    }
    await endNetworkBoot(q, boot.machineId, boot.bootId);
  });

  test('its config is served once, by whichever process is asked, with a token minted then for this boot; a second fetch is refused and recorded', async () => {
    const boot = await armedBoot(['02:00:00:00:04:04']);
    expect(await agentEnrollment(q, boot.machineId)).toBeUndefined();
    const script = (await fetchRaw(`${other.url}/agent-boot/ipxe?mac=02:00:00:00:04:04`)).body.toString();
    const configUrl = configUrlOf(script);
    expect(configUrl.startsWith(other.url)).toBe(true);
    // A HEAD would spend the one serve: it is not answered.
    expect((await fetchRaw(configUrl, { method: 'HEAD' })).status).toBe(404);
    const served = await fetchRaw(configUrl);
    expect(served.status).toBe(200);
    expect(served.headers['cache-control']).toBe('no-store');
    const enrollment = enrollmentOf(served.body);
    expect(enrollment.init.machineId).toBe(boot.machineId);
    expect(parseCpio(served.body).get('etc/bmaas/agent-flags')?.data.toString()).toBe('--interval=3000ms\n');
    // The token was minted as the config was served, for this boot; the database holds its hash alone.
    const issued = await agentEnrollment(q, boot.machineId);
    expect(issued?.bootId).toBe(boot.bootId);
    expect(issued?.enrolledAt).toBeUndefined();
    const stored = await q
      .selectFrom('machine_network_boot')
      .selectAll()
      .where('machine_id', '=', boot.machineId)
      .executeTakeFirstOrThrow();
    expect(JSON.stringify(stored)).not.toContain(enrollment.token);

    // Fetched again, from this process or the other: 410, the boot marked, the fetch in the machine's history.
    for (const server of [files, other]) {
      const again = await fetchRaw(`${server.url}/agent-boot/b/${boot.capability}/config.cpio`);
      expect(again.status).toBe(410);
      expect(again.body.toString()).not.toContain(enrollment.token);
    }
    const state = await networkBootState(q, boot.machineId, boot.bootId);
    expect(state?.configServedTo).toBe('127.0.0.1');
    expect(state?.configRefusedTo).toBe('127.0.0.1');
    expect(state?.configRefusedAt).toBeInstanceOf(Date);
    const history = await operatorHistory(q, boot.machineId);
    expect(history.map((entry) => [entry.action, entry.outcome])).toEqual([
      ['ServeBootConfig', 'Succeeded'],
      ['ServeBootConfig', 'Refused'],
      ['ServeBootConfig', 'Refused'],
    ]);
    expect(history[1]?.cause).toBe(
      `machine ${boot.machineId}: its network boot's config was fetched again, by 127.0.0.1, after it was served to 127.0.0.1: the boot fails; its token had enrolled no agent`,
    );
    // The token served enrolls, once.
    await enrollAgent(q, { machineId: boot.machineId, token: enrollment.token, agentPublicKey: randomBytes(32) });
    expect((await agentEnrollment(q, boot.machineId))?.enrolledAt).toBeInstanceOf(Date);
    await endNetworkBoot(q, boot.machineId, boot.bootId);
  });

  test('fetched again after its token enrolled an agent, that agent is trusted no more: its AgentStarted and heartbeat go', async () => {
    const boot = await armedBoot([]);
    const configUrl = `${files.url}/agent-boot/b/${boot.capability}/config.cpio`;
    const { token } = enrollmentOf((await fetchRaw(configUrl)).body);
    // Whoever was served first enrolled, and heartbeats.
    await enrollAgent(q, { machineId: boot.machineId, token, agentPublicKey: randomBytes(32) });
    await setAgentHeartbeat(q, boot.machineId);
    expect((await fetchRaw(configUrl)).status).toBe(410);
    const started = await q
      .selectFrom('machine_agent_started')
      .select('machine_id')
      .where('machine_id', '=', boot.machineId)
      .execute();
    expect(started).toEqual([]);
    const heartbeat = await q
      .selectFrom('machine_agent_heartbeat')
      .select('machine_id')
      .where('machine_id', '=', boot.machineId)
      .execute();
    expect(heartbeat).toEqual([]);
    const refused = (await operatorHistory(q, boot.machineId)).filter((entry) => entry.outcome === 'Refused');
    expect(refused.map((entry) => entry.cause)).toEqual([
      `machine ${boot.machineId}: its network boot's config was fetched again, by 127.0.0.1, after it was served to 127.0.0.1: the boot fails; the agent its token enrolled is trusted no more (AgentStarted removed), so the machine is booted again`,
    ]);
    await endNetworkBoot(q, boot.machineId, boot.bootId);
  });

  test('its config served together to two processes is served to one of them alone', async () => {
    const boot = await armedBoot([]);
    const answers = await Promise.all(
      [files, other, files, other].map((server) =>
        fetchRaw(`${server.url}/agent-boot/b/${boot.capability}/config.cpio`),
      ),
    );
    expect(answers.map((answer) => answer.status).sort()).toEqual([200, 410, 410, 410]);
    await endNetworkBoot(q, boot.machineId, boot.bootId);
  });

  test('its script and config are answered only while its boot waits: not once it ended, nor once its claim is gone', async () => {
    const ended = await armedBoot(['02:00:00:00:05:05']);
    expect(
      configUrlOf((await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02:00:00:00:05:05`)).body.toString()),
    ).toContain(ended.capability);
    expect(await endNetworkBoot(q, ended.machineId, ended.bootId)).toBe(true);
    expect((await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02:00:00:00:05:05`)).body.toString()).toMatch(
      /no agent boot is prepared for MAC 02:00:00:00:05:05/,
    );
    expect((await fetchRaw(`${files.url}/agent-boot/b/${ended.capability}/script.ipxe`)).status).toBe(404);
    // A fetch of its config after the end mints nothing, and is recorded against the machine.
    expect((await fetchRaw(`${files.url}/agent-boot/b/${ended.capability}/config.cpio`)).status).toBe(410);
    expect(await agentEnrollment(q, ended.machineId)).toBeUndefined();
    expect((await operatorHistory(q, ended.machineId)).map((entry) => entry.outcome)).toEqual(['Refused']);

    // The booter's process died: its session expired, its claim is gone with it.
    const orphaned = await armedBoot(['02:00:00:00:06:06']);
    await q
      .updateTable('sessions')
      .set({ deadline: sql<Date>`now() - interval '1 second'` })
      .where('session_id', '=', orphaned.sessionId)
      .execute();
    expect((await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02:00:00:00:06:06`)).body.toString()).toMatch(
      /no agent boot is prepared/,
    );
    expect((await fetchRaw(`${files.url}/agent-boot/b/${orphaned.capability}/config.cpio`)).status).toBe(410);
    expect(await agentEnrollment(q, orphaned.machineId)).toBeUndefined();
  });

  test('a MAC two live boots have answers neither; an unknown MAC, or none, gets a script that says why and exits', async () => {
    const first = await armedBoot(['02:00:00:00:07:07']);
    const second = await armedBoot(['02:00:00:00:07:07']);
    const script = (await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02:00:00:00:07:07`)).body.toString();
    expect(script).toBe(
      "#!ipxe\necho BMaaS shepherd: MAC 02:00:00:00:07:07 is several machines' in the inventory; no agent boot\nexit 1\n",
    );
    for (const boot of [first, second]) await endNetworkBoot(q, boot.machineId, boot.bootId);

    const unknown = await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02:00:00:00:00:99`);
    // 200: iPXE runs no script from an error response, so a 404 would not say why.
    expect(unknown.status).toBe(200);
    expect(unknown.body.toString('utf8')).toBe(
      '#!ipxe\necho BMaaS shepherd: no agent boot is prepared for MAC 02:00:00:00:00:99; going on to the next boot device\nexit 1\n',
    );
    // The last: iPXE's variable unexpanded, as a DHCP server quoting it wrongly sends it.
    for (const query of ['', '?mac=', '?mac=not-a-mac', '?mac=%24%7Bnet0/mac%7D']) {
      const got = await fetchRaw(`${files.url}/agent-boot/ipxe${query}`);
      expect(got.status, query).toBe(200);
      expect(got.body.toString('utf8'), query).toMatch(
        /^#!ipxe\necho BMaaS shepherd: no MAC address in the request[^\n$]*\nexit 1\n$/,
      );
    }
  });

  test('a token minted for a boot is refused once that boot is revoked', async () => {
    const boot = await armedBoot([]);
    const { token } = enrollmentOf((await fetchRaw(`${files.url}/agent-boot/b/${boot.capability}/config.cpio`)).body);
    expect(await revokeEnrollmentToken(q, boot.machineId, boot.bootId)).toBe(true);
    const refused = await enrollAgent(q, { machineId: boot.machineId, token, agentPublicKey: randomBytes(32) }).catch(
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(EnrollmentRefusedError);
    expect((refused as EnrollmentRefusedError).reason).toBe('Expired');
  });

  test('nothing logged names a capability or a token; the machine, the file and the range are', async () => {
    const { lines, restore } = captureDebugLog('shepherd:*');
    const media = bootOf();
    let prepared: Awaited<ReturnType<AgentBootFiles['prepare']>>;
    let network: Awaited<ReturnType<typeof armedBoot>>;
    let token: string;
    try {
      prepared = await files.prepare(media);
      await fetchRaw(prepared.isoUrl, { headers: { range: 'bytes=0-2047' } });
      await fetchRaw(`${prepared.isoUrl}x`);
      await files.forget(prepared);
      network = await armedBoot(['02:00:00:00:03:03']);
      await fetchRaw(`${files.url}/agent-boot/ipxe?mac=02-00-00-00-03-03`);
      token = enrollmentOf((await fetchRaw(`${files.url}/agent-boot/b/${network.capability}/config.cpio`)).body).token;
      await fetchRaw(`${files.url}/agent-boot/b/${network.capability}/config.cpio`);
    } finally {
      restore();
    }
    expect(prepared.capability).toHaveLength(43);
    const text = lines.join('\n');
    for (const secret of [prepared.capability, network.capability, media.token.reveal(), token]) {
      expect(text).not.toContain(secret);
    }
    expect(text).toContain(`machine ${media.machineId}: agent.iso 206 bytes 0-2047/`);
    expect(text).toContain(`forgot an agent boot of machine ${media.machineId}`);
    expect(text).toContain(`machine ${network.machineId}: iPXE script for MAC 02:00:00:00:03:03`);
    expect(text).toContain(`machine ${network.machineId}: config.cpio of its network boot served to 127.0.0.1`);
    expect(text).toContain(
      `machine ${network.machineId}: the config of its network boot was fetched again, by 127.0.0.1, after it was served to 127.0.0.1: refused, and the boot fails`,
    );
  });
});

describe('what a client may hold of the server', () => {
  /** An image directory whose vmlinuz (64 MiB, sparse) is more than the kernel buffers for a client that stopped reading. */
  async function largeImage(name: string): Promise<{ imageDir: string; kernel: string }> {
    const large = path.join(dir, name);
    await mkdir(large);
    for (const file of ['initramfs', 'agent.iso']) await copyFile(path.join(imageDir, file), path.join(large, file));
    const kernel = path.join(large, 'vmlinuz');
    await writeFile(kernel, '');
    await truncate(kernel, 64 * 1024 * 1024);
    return { imageDir: large, kernel };
  }

  /** How many descriptors of this process (the server's) are open on `file`. */
  async function descriptorsOn(file: string): Promise<number> {
    let count = 0;
    for (const fd of await readdir('/proc/self/fd')) {
      const target = await readlink(path.join('/proc/self/fd', fd)).catch(() => undefined);
      if (target === file) count++;
    }
    return count;
  }

  /** A plain HTTP/1.1 connection to `port` asking for `target`, which stops reading once its first bytes came. */
  interface StalledDownload {
    readonly socket: Socket;
    /** Bytes it read. */
    readonly received: () => number;
    readonly closed: () => boolean;
  }

  function stalledDownload(port: number, target: string, firstBytes = true): Promise<StalledDownload> {
    return new Promise((resolve, reject) => {
      let received = 0;
      let closed = false;
      const socket = connect(port, '127.0.0.1');
      const download = { socket, received: () => received, closed: () => closed };
      socket.on('error', () => {});
      socket.on('close', () => {
        closed = true;
        resolve(download);
      });
      socket.on('data', (chunk: Buffer) => {
        if (received === 0) socket.pause();
        received += chunk.length;
        resolve(download);
      });
      socket.once('connect', () => {
        socket.write(`GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
        if (!firstBytes) resolve(download);
      });
      socket.once('error', reject);
    });
  }

  test('downloads whose clients stopped reading are closed after idleTimeout, and their files with them', async () => {
    const { imageDir: large, kernel } = await largeImage('large-image-idle');
    const own = await AgentBootFiles.start({
      imageDir: large,
      db: q,
      workDir: path.join(dir, 'work-idle'),
      listen: { host: '127.0.0.1', port: 0 },
      // Long enough for each download's first bytes on a loaded machine.
      limits: { idleTimeout: 1000 },
    });
    try {
      const stalled = await Promise.all(
        Array.from({ length: 5 }, () => stalledDownload(own.port, '/agent-boot/vmlinuz')),
      );
      expect(stalled.every((download) => download.received() > 0 && !download.closed())).toBe(true);
      expect(await descriptorsOn(kernel)).toBe(5);
      await eventually('their files closed', async () => ((await descriptorsOn(kernel)) === 0 ? true : undefined));
      // A paused socket sees nothing of its end: read on, each ends short of the 64 MiB.
      for (const download of stalled) download.socket.resume();
      await eventually('the stalled downloads closed by the server', async () =>
        stalled.every((download) => download.closed()) ? true : undefined,
      );
      expect(stalled.every((download) => download.received() < 64 * 1024 * 1024)).toBe(true);
      // The server serves on.
      expect((await fetchRaw(`${own.url}/agent-boot/initramfs`)).status).toBe(200);
    } finally {
      await own.close();
    }
  });

  test('connections past the limit are closed as they are accepted, logged once; once some close, new ones are served', async () => {
    const { imageDir: large } = await largeImage('large-image-cap');
    const own = await AgentBootFiles.start({
      imageDir: large,
      db: q,
      workDir: path.join(dir, 'work-cap'),
      listen: { host: '127.0.0.1', port: 0 },
      limits: { connections: 2 },
    });
    const { lines, restore } = captureDebugLog('shepherd:boot-files');
    try {
      const held = await Promise.all([1, 2].map(() => stalledDownload(own.port, '/agent-boot/vmlinuz')));
      for (let i = 0; i < 2; i++) {
        const refused = await stalledDownload(own.port, '/agent-boot/initramfs', false);
        await eventually('the connection past the limit closed', async () => (refused.closed() ? true : undefined));
        expect(refused.received()).toBe(0);
      }
      expect(lines.filter((line) => line.includes('connections limit'))).toEqual([
        expect.stringContaining(
          'at 2 open connections (the agent boot files connections limit): refusing new ones until some close',
        ),
      ]);
      for (const download of held) download.socket.destroy();
      const served = await eventually('a connection served again', async () => {
        const answer = await fetchRaw(`${own.url}/agent-boot/initramfs`).catch(() => undefined);
        return answer?.status === 200 ? answer : undefined;
      });
      expect(served.body.equals(image.initramfs)).toBe(true);
    } finally {
      restore();
      await own.close();
    }
  });

  test('limits that are not whole numbers above zero are refused, naming the limit', async () => {
    const start = (limits: AgentBootFilesOptions['limits']) =>
      AgentBootFiles.start({ imageDir, db: q, listen: { host: '127.0.0.1', port: 0 }, limits });
    await expect(start({ connections: 0 })).rejects.toThrow(
      new RangeError('agent boot files limits: connections must be a whole number above zero, got 0'),
    );
    await expect(start({ idleTimeout: 2 ** 31 })).rejects.toThrow(
      'agent boot files limits: idleTimeout must be at most 2147483647 ms, got 2147483648',
    );
  });
});

test('over TLS: the image in ranges, and a boot’s URLs under the public URL', async () => {
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const cert = certificatePem(
    selfSignedCertificate(privateKey, { commonName: 'shepherd', altNames: ['127.0.0.1', 'localhost'] }),
  );
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const tls = await AgentBootFiles.start({
    imageDir,
    db: q,
    workDir: path.join(dir, 'work-tls'),
    listen: { host: '127.0.0.1', port: 0 },
    tls: { cert, key },
  });
  try {
    expect(tls.url).toBe(`https://127.0.0.1:${tls.port}`);
    const piece = await fetchRaw(`${tls.url}/agent-boot/vmlinuz`, { headers: { range: 'bytes=-4096' }, ca: cert });
    expect(piece.status).toBe(206);
    expect(piece.body.equals(image.vmlinuz.subarray(-4096))).toBe(true);
    const boot = bootOf();
    const prepared = await tls.prepare(boot);
    expect((await fetchRaw(prepared.isoUrl, { method: 'HEAD', ca: cert })).status).toBe(200);
    // A network boot over HTTPS, as an iPXE built with the shepherd's CA fetches it: its script, then its config once.
    const network = await armedBoot(['02:00:00:00:08:08']);
    const script = (await fetchRaw(`${tls.url}/agent-boot/ipxe?mac=02:00:00:00:08:08`, { ca: cert })).body.toString();
    const configUrl = configUrlOf(script);
    expect(configUrl).toBe(`${tls.url}/agent-boot/b/${network.capability}/config.cpio`);
    // Plain HTTP to the TLS port is no answer, and spends nothing.
    await expect(fetchRaw(configUrl.replace('https:', 'http:'))).rejects.toThrow();
    const served = await fetchRaw(configUrl, { ca: cert });
    expect(served.status).toBe(200);
    expect(enrollmentOf(served.body).init.machineId).toBe(network.machineId);
    expect((await fetchRaw(configUrl, { ca: cert })).status).toBe(410);
  } finally {
    await tls.close();
  }
  // Behind another name: the URLs say the name machines resolve.
  const named = await AgentBootFiles.start({
    imageDir,
    db: q,
    workDir: path.join(dir, 'work-named'),
    listen: { host: '127.0.0.1', port: 0 },
    tls: { cert, key },
    publicUrl: 'https://shepherd.example:8443/',
  });
  try {
    expect(named.url).toBe('https://shepherd.example:8443');
    expect((await named.prepare(bootOf())).isoUrl).toMatch(
      /^https:\/\/shepherd\.example:8443\/agent-boot\/b\/[\w-]{43}\/agent\.iso$/,
    );
  } finally {
    await named.close();
  }
});

test('start refuses an image directory without the image, and a public URL with a path, naming them', async () => {
  const empty = path.join(dir, 'no-image');
  await mkdir(empty);
  const missing = await AgentBootFiles.start({ imageDir: empty, db: q, listen: { host: '127.0.0.1', port: 0 } }).catch(
    (e: unknown) => e,
  );
  expect(missing).toBeInstanceOf(AgentBootFilesError);
  expect((missing as Error).message).toContain(
    `agent image ${path.join(empty, 'vmlinuz')} is missing (build it with shepherd agent-image build --out ${empty})`,
  );
  const badUrl = await AgentBootFiles.start({
    imageDir,
    db: q,
    listen: { host: '127.0.0.1', port: 0 },
    publicUrl: 'https://shepherd.example/boot',
  }).catch((e: unknown) => e);
  expect(badUrl).toBeInstanceOf(AgentBootFilesError);
  expect((badUrl as Error).message).toBe(
    'public URL "https://shepherd.example/boot": want http(s)://host[:port] with no path, query or credentials',
  );
  const taken = await AgentBootFiles.start({ imageDir, db: q, listen: { host: '127.0.0.1', port: files.port } }).catch(
    (e: unknown) => e,
  );
  expect(taken).toBeInstanceOf(AgentBootFilesError);
  expect((taken as Error).message).toBe(`cannot serve agent boot files on 127.0.0.1:${files.port} (EADDRINUSE)`);
});
