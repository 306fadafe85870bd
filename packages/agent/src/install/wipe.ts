import { execFile } from 'node:child_process';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { driverlessMessage, readControllers } from '../hardware/controllers.js';
import { readDisks } from '../hardware/disks.js';
import { InstallationError } from './errors.js';
import { HEAD_BYTES, TargetDisk } from './target-disk.js';

const execFileAsync = promisify(execFile);

/** The bytes zeroed at each end of a disk: the start's signatures, MBR and GPT; the end's backup GPT and superblocks. */
export const WIPED_END_BYTES = HEAD_BYTES;

/** Where a wipe reads the machine's disks. */
export interface WipeOptions {
  /** The root of sysfs and /dev (`/` on a machine): the disks are listed from its sysfs and opened under it. */
  readonly root?: string | undefined;
  /** Stops the wipe between disks and between its steps. */
  readonly signal?: AbortSignal | undefined;
}

/** What a wipe did to one disk. */
export interface WipedDisk {
  /** The device node wiped (under the wipe's root). */
  readonly device: string;
  readonly sizeBytes: number;
  /** Whether the whole device was discarded (BLKDISCARD); false where the device cannot discard. */
  readonly discarded: boolean;
  /** Why it was not discarded, when it was not. */
  readonly discardSkipped?: string;
}

/**
 * Wipes the metadata of every disk of the machine (cloud/agent/api/disk_wipe.proto):
 * each whole disk the hardware report lists is discarded where it can be
 * (`blkdiscard`, BLKDISCARD), then its first and last MiB are zeroed (both
 * GPT headers and their entries, the MBR, filesystem, RAID and LVM
 * signatures at either end) and flushed. Every disk is tried even after one
 * failed; the error names each that failed.
 *
 * @throws {@link InstallationError} (`device`) before wiping anything when
 *   a storage controller has no driver (its disks cannot be seen, so a wipe
 *   of the others is no wipe of the machine); when the machine has no disk,
 *   or any disk could not be zeroed and flushed
 */
export async function wipeDisks(options: WipeOptions = {}): Promise<WipedDisk[]> {
  const root = options.root ?? '/';
  // Every storage controller has a driver: else the disks behind it would be left as they are.
  const blind = (await readControllers(root)).filter((c) => c.kind === 'storage' && c.driver === '');
  if (blind.length > 0) {
    throw new InstallationError('device', `disk wipe: ${blind.map(driverlessMessage).join('; ')}: nothing wiped`);
  }
  const disks = await readDisks(root, []);
  if (disks.length === 0) throw new InstallationError('device', 'disk wipe: the machine has no disk to wipe');
  const wiped: WipedDisk[] = [];
  const failures: string[] = [];
  for (const disk of disks) {
    options.signal?.throwIfAborted();
    const device = path.join(root, disk.path);
    try {
      wiped.push(await wipeDisk(device, options.signal));
    } catch (error) {
      if (options.signal?.aborted) throw error;
      failures.push(`${disk.path} (${disk.serialNumber || 'no serial'}): ${(error as Error).message}`);
    }
  }
  if (failures.length > 0) {
    throw new InstallationError(
      'device',
      `disk wipe: ${failures.length} of ${disks.length} disks not wiped: ${failures.join('; ')}`,
    );
  }
  return wiped;
}

/**
 * Discards `device` where it can, then zeroes its ends and flushes. A block
 * device is opened exclusively first: one mounted or held by another program
 * is refused before anything is discarded.
 */
export async function wipeDisk(device: string, signal?: AbortSignal): Promise<WipedDisk> {
  // blkdiscard opens the device exclusively itself: the check closes it again before.
  await (await TargetDisk.open(device)).close();
  const discard = await discardDevice(device, signal);
  signal?.throwIfAborted();
  const disk = await TargetDisk.open(device);
  try {
    await disk.zeroEnds();
  } finally {
    await disk.close();
  }
  return { device, sizeBytes: disk.capacity, ...discard };
}

/**
 * BLKDISCARD over the whole device, through `blkdiscard` (util-linux, or
 * busybox's in the agent image): Node has no ioctl. A device that cannot
 * discard (a disk without TRIM, a regular file standing in for a disk) is
 * skipped, saying why; it is zeroed at both ends all the same.
 */
async function discardDevice(
  device: string,
  signal: AbortSignal | undefined,
): Promise<Pick<WipedDisk, 'discarded' | 'discardSkipped'>> {
  if (!(await stat(device)).isBlockDevice()) return { discarded: false, discardSkipped: 'not a block device' };
  try {
    await execFileAsync('blkdiscard', [device], { signal });
    return { discarded: true };
  } catch (error) {
    signal?.throwIfAborted();
    const failed = error as Error & { stderr?: string };
    return { discarded: false, discardSkipped: (failed.stderr || failed.message).trim() };
  }
}
