import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { selfSignedServerTls } from '@bmaas/server';
import { create } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { OSInstallationRequestSchema } from '../src/gen/cloud/agent/api/agent_pb.js';
import { DiskImageInstallationRequest_Compression as Compression } from '../src/gen/cloud/agent/api/disk_image_pb.js';
import { addBootEntry, bootOrder, EFI_GLOBAL_VARIABLE, encodeLoadOption } from '../src/install/efi-boot.js';
import { InstallationError } from '../src/install/errors.js';
import { guidBytes } from '../src/install/gpt.js';
import { install } from '../src/install/install.js';
import { HEAD_BYTES, writeDiskImage } from '../src/install/write-image.js';
import { ESP_TYPE_GUID, gptDiskImage, LINUX_TYPE_GUID } from './disk-image-builder.js';

const MiB = 2 ** 20;
const ESP_GUID = '9F1B8E2A-3C4D-4E5F-8A9B-0C1D2E3F4A5B';
/** A 6 MiB image: a GPT with an ESP at LBA 2048 (1 MiB) of 2 MiB and a Linux partition after it. */
const image = gptDiskImage(6 * MiB, [
  { type: ESP_TYPE_GUID, guid: ESP_GUID, firstLba: 2048, lastLba: 6143 },
  { type: LINUX_TYPE_GUID, guid: '11111111-2222-4333-8444-555555555555', firstLba: 6144, lastLba: 12254 },
]);
const imageSha256 = createHash('sha256').update(image).digest('hex');
const gzipped = gzipSync(image);
const gzippedSha256 = createHash('sha256').update(gzipped).digest('hex');

let server: Server;
let base: string;
let dir: string;
/** Requests to /stall, whose answers never end: ended when the file's tests are. */
const stalled: import('node:http').ServerResponse[] = [];

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-install-'));
  server = createServer((request, response) => {
    if (request.url === '/image.raw') response.end(image);
    else if (request.url === '/image.raw.gz') response.end(gzipped);
    else if (request.url === '/stall') {
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

const zeros = (bytes: Buffer) => bytes.every((byte) => byte === 0);

describe('writing a disk image', () => {
  test('a raw image lands at the disk start, flushed; the rest of the disk is untouched', async () => {
    const disk = await oldDisk();
    const written = await writeDiskImage({ url: `${base}/image.raw`, sha256: imageSha256, compression: 'none' }, disk);
    expect(written).toEqual({ bytes: image.length, downloaded: image.length });
    const contents = await readFile(disk);
    expect(contents.subarray(0, image.length).equals(image)).toBe(true);
    expect(contents.subarray(image.length).every((byte) => byte === 0xaa)).toBe(true);
  });

  test('a gzip image is checked as downloaded and written decompressed', async () => {
    const disk = await oldDisk();
    const written = await writeDiskImage(
      { url: `${base}/image.raw.gz`, sha256: gzippedSha256.toUpperCase(), compression: 'gzip' },
      disk,
    );
    expect(written).toEqual({ bytes: image.length, downloaded: gzipped.length });
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

  test('on a UEFI machine: the image, then a boot entry for its ESP, first in BootOrder', async () => {
    const disk = await oldDisk();
    const efivars = await mkdtemp(path.join(dir, 'efivars-'));
    const installed = await install(request({ rootDevice: disk }), { efivars });
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

  test('on a BIOS machine (no efivarfs), no boot entry', async () => {
    const disk = await oldDisk();
    expect(await install(request({ rootDevice: disk }), { efivars: path.join(dir, 'no-efivars') })).toEqual({
      device: disk,
      bytes: image.length,
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
