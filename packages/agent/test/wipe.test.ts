import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, test } from 'vitest';
import { InstallationError } from '../src/install/errors.js';
import { WIPED_END_BYTES, wipeDisk, wipeDisks } from '../src/install/wipe.js';
import { gptDiskImage, LINUX_TYPE_GUID } from './disk-image-builder.js';

const MiB = 2 ** 20;
const DISK_BYTES = 8 * MiB;
const scratch: string[] = [];
afterAll(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** A GPT disk (both headers, a partition filling it with the pattern): what a wipe must leave unrecognizable. */
const gptDisk = () =>
  gptDiskImage(DISK_BYTES, [
    { type: LINUX_TYPE_GUID, guid: '0D5F3D9E-8D1A-4C55-9A49-0C6C7B1A2F10', firstLba: 2048, lastLba: 16000 },
  ]);

/** The recorded two-socket server, with regular files standing in for its three disks' nodes. */
async function twoSocketServer(disks: readonly string[] = ['nvme0n1', 'sda', 'sdb']): Promise<string> {
  const root = await mkdtemp(path.join(tmpdir(), 'agent-wipe-'));
  scratch.push(root);
  await cp(fileURLToPath(new URL('./fixtures/two-socket-server/', import.meta.url)), root, {
    recursive: true,
    verbatimSymlinks: true,
  });
  for (const disk of disks) await writeFile(path.join(root, 'dev', disk), gptDisk());
  return root;
}

/** Whether the first and last MiB are zeros and what lies between is untouched. */
function wipedEnds(disk: Buffer): { start: boolean; end: boolean; middle: boolean } {
  const original = gptDisk();
  return {
    start: disk.subarray(0, WIPED_END_BYTES).every((byte) => byte === 0),
    end: disk.subarray(disk.length - WIPED_END_BYTES).every((byte) => byte === 0),
    middle: disk
      .subarray(WIPED_END_BYTES, disk.length - WIPED_END_BYTES)
      .equals(original.subarray(WIPED_END_BYTES, disk.length - WIPED_END_BYTES)),
  };
}

describe('a disk wipe', () => {
  test("zeroes both ends of every disk the report lists (a GPT's primary and backup headers), flushed", async () => {
    const root = await twoSocketServer();
    const before = gptDisk();
    // The disks were GPT disks at both ends: "EFI PART" at LBA 1 and in the last LBA.
    expect(before.subarray(512, 520).toString()).toBe('EFI PART');
    expect(before.subarray(before.length - 512, before.length - 504).toString()).toBe('EFI PART');
    const wiped = await wipeDisks({ root });
    expect(wiped).toEqual(
      ['nvme0n1', 'sda', 'sdb'].map((name) => ({
        device: path.join(root, 'dev', name),
        sizeBytes: DISK_BYTES,
        discarded: false,
        discardSkipped: 'not a block device',
      })),
    );
    for (const name of ['nvme0n1', 'sda', 'sdb']) {
      expect(wipedEnds(await readFile(path.join(root, 'dev', name))), name).toEqual({
        start: true,
        end: true,
        middle: true,
      });
    }
  });

  test('a disk that cannot be wiped is an InstallationError naming it and its serial; the others are wiped all the same', async () => {
    const root = await twoSocketServer(['nvme0n1', 'sdb']);
    const failed = await wipeDisks({ root }).catch((error: unknown) => error);
    expect(failed).toBeInstanceOf(InstallationError);
    expect((failed as InstallationError).problem).toBe('device');
    expect((failed as Error).message).toMatch(
      /^disk wipe: 1 of 3 disks not wiped: \/dev\/sda \(BTYF01234567480BGN\): root device .*\/dev\/sda missing/,
    );
    expect(wipedEnds(await readFile(path.join(root, 'dev/nvme0n1')))).toMatchObject({ start: true, end: true });
    expect(wipedEnds(await readFile(path.join(root, 'dev/sdb')))).toMatchObject({ start: true, end: true });
  });

  test('a machine without disks is an InstallationError, not a wipe that did nothing', async () => {
    const root = await mkdtemp(path.join(tmpdir(), 'agent-wipe-empty-'));
    scratch.push(root);
    await expect(wipeDisks({ root })).rejects.toThrow(/^disk wipe: the machine has no disk to wipe$/);
  });

  test('a storage controller without a driver fails the wipe before any disk is wiped, naming it', async () => {
    // The disks behind the PERC and the VMD domain are not seen: wiping the SATA SSD alone is no wipe of the machine.
    const root = await mkdtemp(path.join(tmpdir(), 'agent-wipe-driverless-'));
    scratch.push(root);
    await cp(fileURLToPath(new URL('./fixtures/old-image-r740/', import.meta.url)), root, {
      recursive: true,
      verbatimSymlinks: true,
    });
    await mkdir(path.join(root, 'dev'));
    await writeFile(path.join(root, 'dev/sda'), gptDisk());
    const failed = await wipeDisks({ root }).catch((error: unknown) => error);
    expect(failed).toBeInstanceOf(InstallationError);
    expect((failed as InstallationError).problem).toBe('device');
    expect((failed as Error).message).toBe(
      'disk wipe: storage controller 0000:18:00.0 (PCI ID 1000:005d, class 0104) has no driver bound: the disks behind it are not seen; storage controller 0000:5d:05.5 (PCI ID 8086:201d, class 0104) has no driver bound: the disks behind it are not seen: nothing wiped',
    );
    // Compared with equals: expect's deep equality walks a Buffer byte by byte.
    expect((await readFile(path.join(root, 'dev/sda'))).equals(gptDisk())).toBe(true);
  });

  test('a disk smaller than two MiB is zeroed whole', async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'agent-wipe-small-'));
    scratch.push(dir);
    const disk = path.join(dir, 'small');
    await writeFile(disk, Buffer.alloc(MiB + 4096, 0xaa));
    await wipeDisk(disk);
    expect((await readFile(disk)).every((byte) => byte === 0)).toBe(true);
  });

  // A loop device over a file discards by punching holes: what lay between the ends reads as zeros after.
  const loopable = process.getuid?.() === 0 && existsSync('/dev/loop-control');
  if (!loopable) console.warn('disk wipe: the loop device test is skipped: it needs root and /dev/loop-control');
  test.skipIf(!loopable)(
    'a loop device (a real block device) is discarded whole, then zeroed at both ends',
    async () => {
      const dir = await mkdtemp(path.join(tmpdir(), 'agent-wipe-loop-'));
      scratch.push(dir);
      const backing = path.join(dir, 'backing');
      await writeFile(backing, gptDisk());
      const loop = execFileSync('losetup', ['--find', '--show', backing], { encoding: 'utf8' }).trim();
      try {
        const wiped = await wipeDisk(loop);
        expect(wiped).toEqual({ device: loop, sizeBytes: DISK_BYTES, discarded: true });
      } finally {
        execFileSync('losetup', ['--detach', loop]);
      }
      expect((await readFile(backing)).every((byte) => byte === 0)).toBe(true);
    },
  );
});
