import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { constants, existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, open, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { OSInstallationRequestSchema } from '@bmaas/api/cloud/agent/api/agent_pb';
import {
  DiskImageInstallationRequest_Compression as Compression,
  RootDeviceHintsSchema,
} from '@bmaas/api/cloud/agent/api/disk_image_pb';
import { selfSignedServerTls } from '@bmaas/server';
import { create, fromBinary } from '@bufbuild/protobuf';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { eventually } from '../../../test/support/wait.js';
import { addBootEntry, bootOrder, EFI_GLOBAL_VARIABLE, encodeLoadOption } from '../src/install/efi-boot.js';
import { InstallationError } from '../src/install/errors.js';
import { guidBytes } from '../src/install/gpt.js';
import { install } from '../src/install/install.js';
import { wipeDisk } from '../src/install/wipe.js';
import { HEAD_BYTES, writeDiskImage } from '../src/install/write-image.js';
import { ESP_TYPE_GUID, gptDiskImage, LINUX_TYPE_GUID } from './disk-image-builder.js';

const MiB = 2 ** 20;
const ESP_GUID = '9F1B8E2A-3C4D-4E5F-8A9B-0C1D2E3F4A5B';
/** A 6 MiB image: a GPT with an ESP at LBA 2048 (1 MiB) of 2 MiB and a Linux partition after it. */
const image = gptDiskImage(6 * MiB, [
  { type: ESP_TYPE_GUID, guid: ESP_GUID, firstLba: 2048, lastLba: 6143 },
  { type: LINUX_TYPE_GUID, guid: '11111111-2222-4333-8444-555555555555', firstLba: 6144, lastLba: 12254 },
]);
// A MiB that does not compress (qemu-img -c stores such clusters as they are) and one of zeros
// (a qcow2 leaves them unallocated; the disk must still read zeros there).
randomBytes(MiB).copy(image, 2 * MiB);
image.fill(0, 3 * MiB, 4 * MiB);
const imageSha256 = createHash('sha256').update(image).digest('hex');
const gzipped = gzipSync(image);
const gzippedSha256 = createHash('sha256').update(gzipped).digest('hex');
const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

/** The image as operators have it, made by the real tools: name → bytes. */
const served = new Map<string, Buffer>([
  ['image.raw', image],
  ['image.raw.gz', gzipped],
]);
/** Paths the server answers without honouring Range, as a server that does not serve ranges. */
const noRanges = new Set<string>();
/** The xz image cut short, made in beforeAll. */
let truncatedXz: Buffer;
/** The requests the server got, as `Range` header or `whole`, by path. */
const requests: string[] = [];

/** Answers a GET of a served image, honouring one `Range: bytes=a-b` (206) unless the path is in noRanges. */
function serveImage(request: IncomingMessage, response: ServerResponse, name: string, bytes: Buffer): void {
  const range = /^bytes=(\d+)-(\d+)$/.exec(request.headers.range ?? '');
  requests.push(`${name} ${request.headers.range ?? 'whole'}`);
  if (!range || noRanges.has(name)) {
    response.end(bytes);
    return;
  }
  const [start, end] = [Number(range[1]), Math.min(Number(range[2]) + 1, bytes.length)];
  response.writeHead(206, { 'content-range': `bytes ${start}-${end - 1}/${bytes.length}` });
  response.end(bytes.subarray(start, end));
}

let server: Server;
let base: string;
let dir: string;
/** The disk /watched reads when the image is asked for, and whether its ends were zeros then, a request each. */
let watchedDisk: string | undefined;
const endsAtRequest: boolean[] = [];
/** Requests to /stall, whose answers never end: ended when the file's tests are. */
const stalled: import('node:http').ServerResponse[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-install-'));
  // The images as operators have them, made by the real tools (xz-utils, zstd, qemu-utils).
  const raw = path.join(dir, 'image.raw');
  await writeFile(raw, image);
  const run = (program: string, ...args: string[]) => execFileSync(program, args, { cwd: dir, stdio: 'pipe' });
  run('xz', '-k', '-T1', 'image.raw');
  run('zstd', '-q', '-k', 'image.raw');
  run('qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2', 'image.raw', 'image.qcow2');
  run('qemu-img', 'convert', '-c', '-f', 'raw', '-O', 'qcow2', 'image.raw', 'compressed.qcow2');
  run('qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2', '-o', 'compat=0.10', 'image.raw', 'v2.qcow2');
  // The smallest and the largest clusters qcow2 has, compressed: other widths of a compressed entry's fields.
  run('qemu-img', 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', 'cluster_size=512', 'image.raw', '512.qcow2');
  run('qemu-img', 'convert', '-c', '-f', 'raw', '-O', 'qcow2', '-o', 'cluster_size=2M', 'image.raw', '2M.qcow2');
  run('qemu-img', 'create', '-q', '-f', 'qcow2', '-b', 'image.qcow2', '-F', 'qcow2', 'overlay.qcow2');
  run('xz', '-k', '-T1', 'image.qcow2');
  for (const name of [
    'image.raw.xz',
    'image.raw.zst',
    'image.qcow2',
    'compressed.qcow2',
    'v2.qcow2',
    '512.qcow2',
    '2M.qcow2',
    'overlay.qcow2',
    'image.qcow2.xz',
  ]) {
    served.set(name, await readFile(path.join(dir, name)));
  }
  truncatedXz = (served.get('image.raw.xz') as Buffer).subarray(0, 200_000);
  served.set('truncated.raw.xz', truncatedXz);
  server = createServer((request, response) => {
    const url = request.url ?? '';
    const name = url.slice(1);
    const redirect = /^\/redirect\/(\d+)\/(.*)$/.exec(url);
    if (served.has(name)) serveImage(request, response, name, served.get(name) as Buffer);
    else if (redirect) {
      // /redirect/N/x: N more redirects before x, the first two relative, then absolute.
      const [more, rest] = [Number(redirect[1]), redirect[2] as string];
      const location = more > 1 ? `/redirect/${more - 1}/${rest}` : `${base}/${rest}`;
      response.writeHead(more % 2 === 0 ? 302 : 307, { location });
      response.end();
    } else if (url === '/redirect-to-ftp') {
      response.writeHead(301, { location: 'ftp://127.0.0.1/image.raw' });
      response.end();
    } else if (url === '/watched') {
      // What the watched disk holds at its ends the moment the image is asked for.
      if (watchedDisk !== undefined) {
        const now = readFileSync(watchedDisk);
        endsAtRequest.push(zeros(now.subarray(0, MiB)) && zeros(now.subarray(now.length - MiB)));
      }
      response.end(image);
    } else if (url === '/stall-at-4MiB') {
      response.write(image.subarray(0, 4 * MiB));
      stalled.push(response);
    } else if (url === '/stall') {
      // Two MiB of the image, then nothing more.
      response.write(image.subarray(0, 2 * MiB));
      stalled.push(response);
    } else {
      response.statusCode = 404;
      response.end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const response of stalled) response.destroy();
  await new Promise((resolve) => server.close(resolve));
  await rm(dir, { recursive: true, force: true });
});

let disks = 0;
/** A file standing in for a disk of `bytes`, holding an old OS: every byte 0xAA. */
async function oldDisk(bytes = 8 * MiB): Promise<string> {
  const file = path.join(dir, `disk-${disks++}`);
  await writeFile(file, Buffer.alloc(bytes, 0xaa));
  return file;
}

/** A file standing in for a disk of 8 MiB holding an old GPT OS: "EFI PART" at LBA 1 and in its last LBA. */
async function oldGptDisk(): Promise<string> {
  const file = path.join(dir, `disk-${disks++}`);
  await writeFile(
    file,
    gptDiskImage(
      8 * MiB,
      [{ type: ESP_TYPE_GUID, guid: '0D5F3D9E-8D1A-4C55-9A49-0C6C7B1A2F10', firstLba: 2048, lastLba: 6143 }],
      0xaa,
    ),
  );
  return file;
}

const zeros = (bytes: Buffer) => bytes.every((byte) => byte === 0);

describe('writing a disk image', () => {
  test('a raw image lands at the disk start, flushed; the rest of the disk is untouched but its last MiB, zeroed', async () => {
    const disk = await oldDisk();
    const written = await writeDiskImage({ url: `${base}/image.raw`, sha256: imageSha256, compression: 'none' }, disk);
    expect(written).toEqual({ bytes: image.length, downloaded: image.length, format: 'raw' });
    const contents = await readFile(disk);
    expect(contents.subarray(0, image.length).equals(image)).toBe(true);
    // The old disk's backup GPT would lie in its last MiB: zeroed before the download started.
    expect(contents.subarray(image.length, contents.length - MiB).every((byte) => byte === 0xaa)).toBe(true);
    expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
  });

  test('a gzip image is checked as downloaded and written decompressed', async () => {
    const disk = await oldDisk();
    const written = await writeDiskImage(
      { url: `${base}/image.raw.gz`, sha256: gzippedSha256.toUpperCase(), compression: 'gzip' },
      disk,
    );
    expect(written).toEqual({ bytes: image.length, downloaded: gzipped.length, format: 'gzip' });
    expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
  });

  test('a sha256 mismatch is an error, and the disk has neither the image head nor the old one, at either end', async () => {
    const disk = await oldDisk();
    const wrong = 'f'.repeat(64);
    const failure = writeDiskImage({ url: `${base}/image.raw`, sha256: wrong, compression: 'none' }, disk);
    await expect(failure).rejects.toThrow(InstallationError);
    await expect(failure).rejects.toMatchObject({
      problem: 'sha256-mismatch',
      message: expect.stringContaining(`sha256 of ${base}/image.raw is ${imageSha256}, want ${wrong}`),
    });
    const contents = await readFile(disk);
    expect(zeros(contents.subarray(0, HEAD_BYTES))).toBe(true);
    expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
    // What lay past the first MiB was written before the check: harmless without its head.
    expect(contents.subarray(HEAD_BYTES, image.length).equals(image.subarray(HEAD_BYTES))).toBe(true);
  });

  test('an image larger than the disk is an error naming the device, and its ends are zeroed', async () => {
    const disk = await oldDisk(4 * MiB);
    const failure = writeDiskImage({ url: `${base}/image.raw`, sha256: imageSha256, compression: 'none' }, disk);
    await expect(failure).rejects.toMatchObject({
      problem: 'too-large',
      message: `root device ${disk} holds ${4 * MiB} bytes; the image is larger`,
    });
    const contents = await readFile(disk);
    expect(contents.length).toBe(4 * MiB);
    expect(zeros(contents.subarray(0, MiB))).toBe(true);
    expect(zeros(contents.subarray(3 * MiB))).toBe(true);
  });

  test('an HTTP error names the URL and status; a missing device names the device', async () => {
    const disk = await oldDisk();
    await expect(
      writeDiskImage({ url: `${base}/nothing`, sha256: imageSha256, compression: 'none' }, disk),
    ).rejects.toMatchObject({ problem: 'download', message: `HTTP status 404 for ${base}/nothing` });
    const missing = path.join(dir, 'no-such-disk');
    await expect(
      writeDiskImage({ url: `${base}/image.raw`, sha256: imageSha256, compression: 'none' }, missing),
    ).rejects.toMatchObject({ problem: 'device', message: expect.stringContaining(`root device ${missing} missing`) });
  });

  test('an installation longer than its bound is a timeout error, and the disk is wiped at both ends', async () => {
    const disk = await oldDisk();
    const failure = writeDiskImage({ url: `${base}/stall`, sha256: imageSha256, compression: 'none' }, disk, {
      timeoutMs: 300,
    });
    await expect(failure).rejects.toMatchObject({
      problem: 'timeout',
      message: `installation of ${base}/stall onto ${disk} took longer than 0.3 s`,
    });
    const contents = await readFile(disk);
    expect(zeros(contents.subarray(0, MiB))).toBe(true);
    expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
  });

  test('over https, trusting the CA it is given beside the system CAs; refused without it', async () => {
    const tls = await selfSignedServerTls(await mkdtemp(path.join(dir, 'tls-')));
    const secure = createHttpsServer({ cert: tls.cert, key: tls.key }, (_request, response) => response.end(image));
    await new Promise<void>((resolve) => secure.listen(0, '127.0.0.1', resolve));
    try {
      const url = `https://localhost:${(secure.address() as AddressInfo).port}/image.raw`;
      const disk = await oldDisk();
      await writeDiskImage({ url, sha256: imageSha256, compression: 'none' }, disk, { ca: tls.cert });
      expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
      await expect(
        writeDiskImage({ url, sha256: imageSha256, compression: 'none' }, await oldDisk()),
      ).rejects.toMatchObject({ problem: 'download', message: expect.stringContaining(`download of ${url} failed`) });
    } finally {
      secure.closeAllConnections();
      await new Promise((resolve) => secure.close(resolve));
    }
  });

  test('a stop is its own error, not a timeout', async () => {
    const disk = await oldDisk();
    const stop = new AbortController();
    const failure = writeDiskImage({ url: `${base}/stall`, sha256: imageSha256, compression: 'none' }, disk, {
      signal: stop.signal,
    });
    stop.abort();
    await expect(failure).rejects.toMatchObject({ problem: 'stopped' });
    expect(zeros((await readFile(disk)).subarray(0, MiB))).toBe(true);
  });
});

describe('images as operators have them', () => {
  test.each([
    ['image.raw.xz', 'xz'],
    ['image.raw.zst', 'zstd'],
    ['image.qcow2', 'qcow2'],
    ['compressed.qcow2', 'qcow2'],
    ['v2.qcow2', 'qcow2'],
    ['512.qcow2', 'qcow2'],
    ['2M.qcow2', 'qcow2'],
  ] as const)(
    '%s is written as the disk it holds (%s), checked against the sha256 of its bytes as downloaded',
    async (name, format) => {
      const bytes = served.get(name) as Buffer;
      const disk = await oldDisk();
      const written = await writeDiskImage(
        { url: `${base}/${name}`, sha256: sha256(bytes), compression: 'none' },
        disk,
      );
      expect(written).toEqual({ bytes: image.length, downloaded: bytes.length, format });
      const contents = await readFile(disk);
      // The zero MiB too: a qcow2 leaves it unallocated, and the old disk's bytes there must not show through.
      expect(contents.subarray(0, image.length).equals(image)).toBe(true);
      expect(contents.subarray(image.length, contents.length - MiB).every((byte) => byte === 0xaa)).toBe(true);
    },
  );

  test('a qcow2 is mapped with range reads, then downloaded once, front to back', async () => {
    const bytes = served.get('compressed.qcow2') as Buffer;
    requests.length = 0;
    await writeDiskImage(
      { url: `${base}/compressed.qcow2`, sha256: sha256(bytes), compression: 'none' },
      await oldDisk(),
    );
    const whole = requests.filter((r) => r.endsWith(' whole'));
    // One whole GET whose first bytes told the format, one for the conversion; ranges for the header, L1 and L2.
    expect(whole).toEqual(['compressed.qcow2 whole', 'compressed.qcow2 whole']);
    expect(requests.filter((r) => r.includes('bytes=')).length).toBeGreaterThanOrEqual(3);
  });

  test('a wrong sha256 of a qcow2 or an xz image fails the installation and leaves both ends zeroed', async () => {
    for (const name of ['image.qcow2', 'image.raw.xz']) {
      const disk = await oldGptDisk();
      await expect(
        writeDiskImage({ url: `${base}/${name}`, sha256: 'e'.repeat(64), compression: 'none' }, disk),
      ).rejects.toMatchObject({
        problem: 'sha256-mismatch',
        message: expect.stringContaining(`sha256 of ${base}/${name} is ${sha256(served.get(name) as Buffer)}`),
      });
      const contents = await readFile(disk);
      expect(zeros(contents.subarray(0, MiB)), name).toBe(true);
      expect(zeros(contents.subarray(contents.length - MiB)), name).toBe(true);
    }
  });

  test('refused, naming the image: a qcow2 with a backing file, one from a server without ranges, a compressed qcow2, gzip that is not', async () => {
    const overlay = served.get('overlay.qcow2') as Buffer;
    await expect(
      writeDiskImage({ url: `${base}/overlay.qcow2`, sha256: sha256(overlay), compression: 'none' }, await oldDisk()),
    ).rejects.toMatchObject({
      problem: 'format',
      message: `qcow2 image ${base}/overlay.qcow2: it has a backing file: serve the image flattened`,
    });
    noRanges.add('v2.qcow2');
    try {
      await expect(
        writeDiskImage(
          { url: `${base}/v2.qcow2`, sha256: sha256(served.get('v2.qcow2') as Buffer), compression: 'none' },
          await oldDisk(),
        ),
      ).rejects.toMatchObject({
        problem: 'download',
        message: `${base}/v2.qcow2 answered a range request with the whole file (status 200): its server does not serve ranges`,
      });
    } finally {
      noRanges.delete('v2.qcow2');
    }
    const xzQcow2 = served.get('image.qcow2.xz') as Buffer;
    await expect(
      writeDiskImage({ url: `${base}/image.qcow2.xz`, sha256: sha256(xzQcow2), compression: 'none' }, await oldDisk()),
    ).rejects.toMatchObject({
      problem: 'format',
      message: `${base}/image.qcow2.xz is a qcow2 image compressed with xz: serve the qcow2 itself, which the agent reads as it is`,
    });
    await expect(
      writeDiskImage(
        { url: `${base}/image.raw.zst`, sha256: sha256(served.get('image.raw.zst') as Buffer), compression: 'gzip' },
        await oldDisk(),
      ),
    ).rejects.toMatchObject({
      problem: 'format',
      message: `${base}/image.raw.zst was asked for as gzip, but its first bytes say zstd`,
    });
    // An xz cut short: xz's own words, and the disk's ends zeroed.
    const disk = await oldGptDisk();
    await expect(
      writeDiskImage({ url: `${base}/truncated.raw.xz`, sha256: sha256(truncatedXz), compression: 'none' }, disk),
    ).rejects.toMatchObject({
      problem: 'format',
      message: expect.stringMatching(
        new RegExp(
          `^decompressing ${base}/truncated\\.raw\\.xz with xz failed \\(exit 1\\): xz: .*Unexpected end of input`,
        ),
      ),
    });
    const contents = await readFile(disk);
    expect(zeros(contents.subarray(0, MiB)) && zeros(contents.subarray(contents.length - MiB))).toBe(true);
  });

  test('redirects are followed, relative or absolute, up to five; a sixth, or one to another scheme, is an error naming it', async () => {
    const disk = await oldDisk();
    const written = await writeDiskImage(
      {
        url: `${base}/redirect/5/image.qcow2`,
        sha256: sha256(served.get('image.qcow2') as Buffer),
        compression: 'none',
      },
      disk,
    );
    expect(written.format).toBe('qcow2');
    expect((await readFile(disk)).subarray(0, image.length).equals(image)).toBe(true);
    await expect(
      writeDiskImage(
        { url: `${base}/redirect/6/image.raw`, sha256: imageSha256, compression: 'none' },
        await oldDisk(),
      ),
    ).rejects.toMatchObject({
      problem: 'download',
      message: `${base}/redirect/6/image.raw: more than 5 redirects (the last to ${base}/image.raw)`,
    });
    await expect(
      writeDiskImage({ url: `${base}/redirect-to-ftp`, sha256: imageSha256, compression: 'none' }, await oldDisk()),
    ).rejects.toMatchObject({
      problem: 'download',
      message: `${base}/redirect-to-ftp redirects to ftp://127.0.0.1/image.raw: not http or https`,
    });
  });

  test('a download that stalls mid-body is reported as stalled, naming the URL, not as "aborted"', async () => {
    const failure = writeDiskImage(
      { url: `${base}/stall`, sha256: imageSha256, compression: 'none' },
      await oldDisk(),
      {
        idleTimeoutMs: 200,
      },
    );
    await expect(failure).rejects.toMatchObject({
      problem: 'stalled',
      message: `download of ${base}/stall stalled: no data within 0.2 s`,
    });
  });
});

describe('a write that never boots half an image', () => {
  test('both ends of the disk are zeroed and flushed before the download starts', async () => {
    const watched = await oldGptDisk();
    watchedDisk = watched;
    try {
      await writeDiskImage({ url: `${base}/watched`, sha256: imageSha256, compression: 'none' }, watched);
    } finally {
      watchedDisk = undefined;
    }
    expect(endsAtRequest).toEqual([true]);
    const disk = await oldGptDisk();
    const stop = new AbortController();
    const failure = writeDiskImage({ url: `${base}/stall-at-4MiB`, sha256: imageSha256, compression: 'none' }, disk, {
      signal: stop.signal,
    });
    failure.catch(() => {});
    // Mid-download: the body is arriving, the image's head is not written, the old one is gone.
    const contents = await eventually('the image body on the disk', async () => {
      const now = await readFile(disk);
      return now.subarray(3 * MiB, 4 * MiB).equals(image.subarray(3 * MiB, 4 * MiB)) ? now : undefined;
    });
    expect(contents.subarray(512, 520).toString('latin1')).not.toBe('EFI PART');
    expect(zeros(contents.subarray(0, MiB))).toBe(true);
    expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
    stop.abort();
    await expect(failure).rejects.toMatchObject({ problem: 'stopped' });
  });

  test('an agent killed (SIGKILL) in the middle of a write leaves a disk holding nothing at its ends', async () => {
    const child = path.join(dir, 'write-image-child.cjs');
    await build({
      entryPoints: [path.join(import.meta.dirname, 'write-image-child.ts')],
      bundle: true,
      platform: 'node',
      format: 'cjs',
      outfile: child,
      logLevel: 'warning',
    });
    const disk = await oldGptDisk();
    const writer = spawn(process.execPath, [child, `${base}/stall-at-4MiB`, imageSha256, disk], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      writer.on('exit', (_code, signal) => resolve(signal)),
    );
    try {
      // 4 MiB of the 6 MiB image have reached the disk (past its first MiB) when it is killed.
      await eventually('the image body on the disk', async () => {
        const now = await readFile(disk);
        return now.subarray(3 * MiB, 4 * MiB).equals(image.subarray(3 * MiB, 4 * MiB)) || undefined;
      });
    } finally {
      writer.kill('SIGKILL');
    }
    expect(await exited).toBe('SIGKILL');
    const contents = await readFile(disk);
    expect(contents.subarray(512, 520).toString('latin1')).not.toBe('EFI PART');
    expect(contents.subarray(contents.length - 512, contents.length - 504).toString('latin1')).not.toBe('EFI PART');
    expect(zeros(contents.subarray(0, MiB))).toBe(true);
    expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
  });
});

// A loop device over a file: a real block device, opened exclusively as a disk is.
const loopable = process.getuid?.() === 0 && existsSync('/dev/loop-control');
if (!loopable) console.warn('installing: the loop device tests are skipped: they need root and /dev/loop-control');
describe.skipIf(!loopable)('onto a real block device (a loop device)', () => {
  async function withLoop(run: (loop: string, backing: string) => Promise<void>): Promise<void> {
    const backing = await oldGptDisk();
    const loop = execFileSync('losetup', ['--find', '--show', backing], { encoding: 'utf8' }).trim();
    try {
      await run(loop, backing);
    } finally {
      execFileSync('losetup', ['--detach', loop]);
    }
  }

  test('the image is written through the device, its size read from sysfs', async () => {
    await withLoop(async (loop, backing) => {
      const qcow2 = served.get('compressed.qcow2') as Buffer;
      const written = await writeDiskImage(
        { url: `${base}/compressed.qcow2`, sha256: sha256(qcow2), compression: 'none' },
        loop,
      );
      expect(written).toMatchObject({ bytes: image.length, format: 'qcow2' });
      const contents = await readFile(backing);
      expect(contents.subarray(0, image.length).equals(image)).toBe(true);
      expect(zeros(contents.subarray(contents.length - MiB))).toBe(true);
    });
  });

  test('a device another program holds exclusively (as a mount does) is refused, naming it, and left as it was', async () => {
    await withLoop(async (loop, backing) => {
      const before = await readFile(backing);
      const holder = await open(loop, constants.O_RDONLY | constants.O_EXCL);
      try {
        await expect(
          writeDiskImage({ url: `${base}/image.raw`, sha256: imageSha256, compression: 'none' }, loop),
        ).rejects.toMatchObject({
          problem: 'device',
          message: `root device ${loop} cannot be opened exclusively: it is in use (a partition of it is mounted, or another program holds it)`,
        });
        await expect(wipeDisk(loop)).rejects.toMatchObject({ problem: 'device' });
      } finally {
        await holder.close();
      }
      expect((await readFile(backing)).equals(before)).toBe(true);
    });
  });
});

describe('EFI boot entries', () => {
  const partition = { number: 1, uniqueGuid: guidBytes(ESP_GUID), firstLba: 2048n, lastLba: 6143n };

  test('a load option encodes as UEFI 2.10 section 3.1.3 lays it out', () => {
    const encoded = Buffer.from(
      encodeLoadOption({ description: 'OS', partition, loader: '\\EFI\\BOOT\\BOOTX64.EFI' }),
    ).toString('hex');
    // The fixture, field by field.
    const expected = [
      '01000000', // attributes: LOAD_OPTION_ACTIVE
      '5e00', // file path list length: 42 + 48 + 4 = 94
      '4f0053000000', // "OS" in UCS-2, NUL
      // Hard drive media path: type 4, subtype 1, length 42, partition 1, start 2048, size 4096,
      // the partition GUID 9F1B8E2A-3C4D-4E5F-8A9B-0C1D2E3F4A5B mixed-endian, GPT, GUID signature.
      '0401',
      '2a00',
      '01000000',
      '0008000000000000',
      '0010000000000000',
      '2a8e1b9f4d3c5f4e8a9b0c1d2e3f4a5b',
      '02',
      '02',
      // File path media path: type 4, subtype 4, length 4 + 44, then \EFI\BOOT\BOOTX64.EFI in UCS-2, NUL.
      '0404',
      '3000',
      '5c00450046004900',
      '5c0042004f004f005400',
      '5c0042004f004f0054005800360034002e00450046004900',
      '0000',
      '7fff0400', // end of the entire device path
    ].join('');
    expect(encoded).toBe(expected);
  });

  test('a new entry takes the first free number and goes first in BootOrder, the others kept after it', async () => {
    const efivars = await mkdtemp(path.join(dir, 'efivars-'));
    const variable = (name: string, data: number[]) =>
      writeFile(path.join(efivars, `${name}-${EFI_GLOBAL_VARIABLE}`), Buffer.from([7, 0, 0, 0, ...data]));
    await variable('Boot0000', [1, 0, 0, 0]);
    await variable('Boot0001', [1, 0, 0, 0]);
    await variable('BootOrder', [1, 0, 0, 0]);
    // Another vendor's variable of the same name is not a boot entry.
    await writeFile(path.join(efivars, 'Boot0002-00000000-0000-0000-0000-000000000000'), Buffer.alloc(8));
    const number = await addBootEntry(efivars, { description: 'OS', partition, loader: '\\EFI\\BOOT\\BOOTX64.EFI' });
    expect(number).toBe(2);
    expect(await bootOrder(efivars)).toEqual([2, 1, 0]);
    const entry = await readFile(path.join(efivars, `Boot0002-${EFI_GLOBAL_VARIABLE}`));
    expect(entry.subarray(0, 4)).toEqual(Buffer.from([7, 0, 0, 0]));
    expect(
      entry
        .subarray(4)
        .equals(Buffer.from(encodeLoadOption({ description: 'OS', partition, loader: '\\EFI\\BOOT\\BOOTX64.EFI' }))),
    ).toBe(true);
  });
});

describe('installing a request', () => {
  const request = (fields: { rootDevice?: string; hints?: Record<string, unknown> }) =>
    create(OSInstallationRequestSchema, {
      generation: 7n,
      type: {
        case: 'diskImage',
        value: {
          url: `${base}/image.raw.gz`,
          sha256: gzippedSha256,
          compression: Compression.GZIP,
          rootDevice: fields.rootDevice ?? '',
          ...(fields.hints && { rootDeviceHints: fields.hints }),
        },
      },
    });

  let machines = 0;
  /**
   * A machine root: sysfs entries for whole disks of 8 MiB (files standing in for their nodes
   * under dev/, every byte 0xAA), a partition of the first and a dm device.
   */
  async function machine(names: readonly string[] = ['vda']): Promise<string> {
    const root = path.join(dir, `machine-${machines++}`);
    const entry = async (name: string, partition: boolean) => {
      await mkdir(path.join(root, 'sys/class/block', name, 'queue'), { recursive: true });
      await writeFile(path.join(root, 'sys/class/block', name, 'size'), `${(8 * MiB) / 512}\n`);
      if (partition) await writeFile(path.join(root, 'sys/class/block', name, 'partition'), '1\n');
      await mkdir(path.join(root, 'dev'), { recursive: true });
      await writeFile(path.join(root, 'dev', name), Buffer.alloc(8 * MiB, 0xaa));
    };
    for (const name of names) await entry(name, false);
    await entry(`${names[0]}1`, true);
    await entry('dm-0', false);
    return root;
  }

  test('on a UEFI machine: the image, then a boot entry for its ESP, first in BootOrder', async () => {
    const root = await machine();
    const disk = path.join(root, 'dev/vda');
    const efivars = await mkdtemp(path.join(dir, 'efivars-'));
    const installed = await install(request({ rootDevice: '/dev/vda' }), { root, efivars });
    expect(installed).toEqual({ device: disk, bytes: image.length, bootEntry: 0 });
    expect(await bootOrder(efivars)).toEqual([0]);
    const entry = await readFile(path.join(efivars, `Boot0000-${EFI_GLOBAL_VARIABLE}`));
    // The entry points at the ESP the image's GPT has: partition 1, its GUID.
    const option = Buffer.from(
      encodeLoadOption({
        description: `BMaaS installed OS (${path.basename(disk)})`,
        partition: { number: 1, uniqueGuid: guidBytes(ESP_GUID), firstLba: 2048n, lastLba: 6143n },
        loader: '\\EFI\\BOOT\\BOOTX64.EFI',
      }),
    );
    expect(entry.subarray(4).equals(option)).toBe(true);
  });

  test('our earlier boot entries are removed (and dropped from BootOrder) before the write starts; others stay', async () => {
    const root = await machine();
    const efivars = await mkdtemp(path.join(dir, 'efivars-'));
    const esp = {
      number: 1,
      uniqueGuid: guidBytes('0D5F3D9E-8D1A-4C55-9A49-0C6C7B1A2F10'),
      firstLba: 2048n,
      lastLba: 6143n,
    };
    const variable = (name: string, data: Uint8Array) =>
      writeFile(path.join(efivars, `${name}-${EFI_GLOBAL_VARIABLE}`), Buffer.concat([Buffer.from([7, 0, 0, 0]), data]));
    // Two entries of earlier installations (one naming another disk), the network's, and BootOrder over all three.
    await variable('Boot0000', encodeLoadOption({ description: 'UEFI PXEv4', partition: esp, loader: '\\x' }));
    await variable(
      'Boot0001',
      encodeLoadOption({ description: 'BMaaS installed OS (vda)', partition: esp, loader: '\\x' }),
    );
    await variable(
      'Boot0003',
      encodeLoadOption({ description: 'BMaaS installed OS (sdb)', partition: esp, loader: '\\x' }),
    );
    await variable('BootOrder', Uint8Array.from([1, 0, 3, 0, 0, 0]));
    // Mid-write, the earlier entries are gone: none names the old ESP while the new image is half written.
    const stop = new AbortController();
    const stalledRequest = create(OSInstallationRequestSchema, {
      generation: 8n,
      type: { case: 'diskImage', value: { url: `${base}/stall`, sha256: imageSha256, rootDevice: '/dev/vda' } },
    });
    const failure = install(stalledRequest, { root, efivars, signal: stop.signal });
    failure.catch(() => {});
    await eventually('the write under way', async () => {
      const now = await readFile(path.join(root, 'dev/vda'));
      return now.subarray(MiB, 2 * MiB).equals(image.subarray(MiB, 2 * MiB)) || undefined;
    });
    expect((await readdir(efivars)).sort()).toEqual([
      `Boot0000-${EFI_GLOBAL_VARIABLE}`,
      `BootOrder-${EFI_GLOBAL_VARIABLE}`,
    ]);
    expect(await bootOrder(efivars)).toEqual([0]);
    stop.abort();
    await expect(failure).rejects.toMatchObject({ problem: 'stopped' });
    // The next installation adds its own, first.
    const installed = await install(request({ rootDevice: '/dev/vda' }), { root, efivars });
    expect(installed.bootEntry).toBe(1);
    expect(await bootOrder(efivars)).toEqual([1, 0]);
  });

  test('with a first boot, a disk without room for the config drive fails the installation, naming it, both ends zeroed', async () => {
    const root = await machine();
    const disk = path.join(root, 'dev/vda');
    const failure = install(request({ rootDevice: '/dev/vda' }), {
      root,
      firstBoot: { machineId: '0b9c1f7e-5d2a-4c3b-9e8f-7a6b5c4d3e2f', phoneHome: undefined },
    });
    await expect(failure).rejects.toBeInstanceOf(InstallationError);
    await expect(failure).rejects.toMatchObject({
      problem: 'config-drive',
      message: expect.stringContaining(`config drive: ${disk}: no 64 MiB free after the image`),
    });
    const bytes = await readFile(disk);
    expect(bytes.subarray(0, MiB).every((byte) => byte === 0)).toBe(true);
    expect(bytes.subarray(bytes.length - MiB).every((byte) => byte === 0)).toBe(true);
  });

  test('on a BIOS machine (no efivarfs), no boot entry', async () => {
    const root = await machine();
    expect(await install(request({ rootDevice: '/dev/vda' }), { root, efivars: path.join(dir, 'no-efivars') })).toEqual(
      {
        device: path.join(root, 'dev/vda'),
        bytes: image.length,
      },
    );
  });

  test('a root device that is not a whole disk of the machine is refused, naming it, and nothing is written', async () => {
    const root = await machine();
    const outside = await oldDisk();
    for (const [rootDevice, expected] of [
      [
        '/dev/vda1',
        /^root device \/dev\/vda1 of generation 7 is not a whole disk of this machine \(a partition, a dm or md device, a file are not\); disks: \/dev\/vda \(/,
      ],
      ['/dev/dm-0', /^root device \/dev\/dm-0 of generation 7 is not a whole disk of this machine/],
      ['/dev/md0', /^root device \/dev\/md0 of generation 7 is not a whole disk of this machine/],
      [outside, /^root device hint deviceName: ".*" is not a path under \/dev\/$/],
    ] as const) {
      await expect(install(request({ rootDevice }), { root }), rootDevice).rejects.toMatchObject({
        message: expect.stringMatching(expected),
      });
    }
    for (const name of ['vda', 'vda1', 'dm-0']) {
      expect(
        (await readFile(path.join(root, 'dev', name))).every((byte) => byte === 0xaa),
        name,
      ).toBe(true);
    }
    expect((await readFile(outside)).every((byte) => byte === 0xaa)).toBe(true);
  });

  test('hints a newer server sends that this agent does not know are refused by field number, not as "$unknown"', async () => {
    const root = await machine(['vda', 'vdb']);
    // RootDeviceHints with serial_number (4) and a field 8 this agent's schema lacks, as a newer server would encode it.
    const hints = Buffer.concat([
      Buffer.from([0x22, 3]),
      Buffer.from('abc'),
      Buffer.from([0x42, 2]),
      Buffer.from('ok'),
    ]);
    const decoded = fromBinary(RootDeviceHintsSchema, hints);
    expect(decoded.$unknown?.map((field) => field.no)).toEqual([8]);
    const asked = create(OSInstallationRequestSchema, {
      generation: 9n,
      type: {
        case: 'diskImage',
        value: { url: `${base}/image.raw`, sha256: imageSha256, rootDeviceHints: decoded },
      },
    });
    await expect(install(asked, { root })).rejects.toMatchObject({
      problem: 'request',
      message:
        "root device hints of generation 9 carry field 8, unknown to this agent (a newer server's hint): refused, as a hint left out could choose another disk; update the agent image",
    });
  });

  test('by hints: the disk whose serial matches, under the machine root', async () => {
    const root = await mkdtemp(path.join(dir, 'root-'));
    for (const [name, serial] of [
      ['vda', 'first'],
      ['vdb', 'second'],
    ] as const) {
      await mkdir(path.join(root, 'sys/class/block', name, 'queue'), { recursive: true });
      await writeFile(path.join(root, 'sys/class/block', name, 'size'), `${(8 * MiB) / 512}\n`);
      await writeFile(path.join(root, 'sys/class/block', name, 'serial'), `${serial}\n`);
      await mkdir(path.join(root, 'dev'), { recursive: true });
      await writeFile(path.join(root, 'dev', name), Buffer.alloc(8 * MiB, 0xaa));
    }
    await mkdir(path.join(root, 'dev/disk/by-path'), { recursive: true });
    await symlink('../../vdb', path.join(root, 'dev/disk/by-path/pci-0000:00:05.0'));
    const installed = await install(request({ hints: { serialNumber: 'second' } }), { root });
    expect(installed.device).toBe(path.join(root, 'dev/vdb'));
    expect((await readFile(path.join(root, 'dev/vdb'))).subarray(0, image.length).equals(image)).toBe(true);
    expect((await readFile(path.join(root, 'dev/vda'))).every((byte) => byte === 0xaa)).toBe(true);

    await expect(
      install(request({ hints: { deviceName: '/dev/disk/by-path/pci-0000:00:05.0', serialNumber: 'first' } }), {
        root,
      }),
    ).rejects.toMatchObject({
      problem: 'device',
      message: expect.stringMatching(
        /matched no disk; disks seen: \/dev\/vda \(serial "first".*\/dev\/vdb \(serial "second"/,
      ),
    });
    expect(await readdir(path.join(root, 'dev'))).toEqual(['disk', 'vda', 'vdb']);
  });

  test('a request of another kind, or naming no device, is refused before anything is written', async () => {
    await expect(
      install(create(OSInstallationRequestSchema, { generation: 3n, type: { case: 'metropolis', value: {} } })),
    ).rejects.toMatchObject({
      problem: 'request',
      message: 'installation request of generation 3: this agent installs disk images only, got metropolis',
    });
    await expect(install(request({}))).rejects.toMatchObject({
      problem: 'request',
      message: 'installation request of generation 7 names no root device',
    });
  });
});
