import { access, readFile, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import type { OSInstallationRequest } from '../gen/cloud/agent/api/agent_pb.js';
import {
  DiskImageInstallationRequest_Compression as Compression,
  type RootDeviceHints as RootDeviceHintsMessage,
} from '../gen/cloud/agent/api/disk_image_pb.js';
import type { DiskRecord } from '../hardware/disks.js';
import { readDisks } from '../hardware/disks.js';
import { chooseRootDevice, noHints, parseRootDeviceHints, type RootDeviceHints } from '../root-device-hints.js';
import { addBootEntryForDisk } from './efi-boot.js';
import { InstallationError } from './errors.js';
import { writeDiskImage } from './write-image.js';

/** Where an installation reads the machine and writes its boot entry. */
export interface InstallOptions {
  /**
   * The root of sysfs and /dev (`/` on a machine): where the disks are listed
   * for hints, and under which the chosen disk's device node is opened.
   */
  readonly root?: string | undefined;
  /** efivarfs (`/sys/firmware/efi/efivars`); no boot entry is written where it is absent. */
  readonly efivars?: string | undefined;
  /** PEM CA certificate trusted beside the system's for an https image URL. */
  readonly ca?: string | undefined;
  /** Stops the installation. */
  readonly signal?: AbortSignal | undefined;
  /** The longest an installation may take, in milliseconds (15 minutes unless given). */
  readonly timeoutMs?: number | undefined;
}

/** What a successful installation did. */
export interface Installed {
  /** The device written. */
  readonly device: string;
  readonly bytes: number;
  /** The Boot#### entry added, when the machine boots by UEFI. */
  readonly bootEntry?: number;
}

/**
 * Carries out an OS installation request: a disk image (this project's
 * extension, cloud/agent/api/disk_image.proto) onto the root device the
 * request names, by path or by hints; on a UEFI machine, then a boot entry
 * for it first in BootOrder.
 *
 * @throws {@link InstallationError} for a request of another kind or without
 *   a device, hints that match no disk or several, and every failure of
 *   {@link writeDiskImage} and {@link addBootEntryForDisk}
 */
export async function install(request: OSInstallationRequest, options: InstallOptions = {}): Promise<Installed> {
  const { type, generation } = request;
  if (type.case !== 'diskImage') {
    throw new InstallationError(
      'request',
      `installation request of generation ${generation}: this agent installs disk images only, got ${type.case ?? 'no type'}`,
    );
  }
  const image = type.value;
  const root = options.root ?? '/';
  const target = await rootDevice(image.rootDevice, image.rootDeviceHints, root, generation);
  const { bytes } = await writeDiskImage(
    {
      url: image.url,
      sha256: image.sha256,
      compression: image.compression === Compression.GZIP ? 'gzip' : 'none',
    },
    target.path,
    { ca: options.ca, signal: options.signal, timeoutMs: options.timeoutMs },
  );
  if (options.efivars === undefined || !(await present(options.efivars))) return { device: target.path, bytes };
  const bootEntry = await addBootEntryForDisk(
    options.efivars,
    target.path,
    target.logicalBlockSize,
    `BMaaS installed OS (${path.basename(target.path)})`,
  );
  return { device: target.path, bytes, bootEntry };
}

/** The device to write: the request's path as it is, or the one disk its hints (and path) match. */
async function rootDevice(
  devicePath: string,
  given: RootDeviceHintsMessage | undefined,
  root: string,
  generation: bigint,
): Promise<Pick<DiskRecord, 'path' | 'logicalBlockSize'>> {
  if (given === undefined) {
    if (devicePath === '') {
      throw new InstallationError('request', `installation request of generation ${generation} names no root device`);
    }
    return { path: devicePath, logicalBlockSize: await logicalBlockSize(devicePath) };
  }
  const hints = hintsOf(given, devicePath);
  if (noHints(hints)) {
    throw new InstallationError(
      'request',
      `installation request of generation ${generation} has empty root device hints`,
    );
  }
  const disks = await readDisks(root, []);
  try {
    const disk = chooseRootDevice(disks, hints);
    // The device node under the same root as sysfs: /dev/sda on the machine.
    return { path: path.join(root, disk.path), logicalBlockSize: disk.logicalBlockSize };
  } catch (error) {
    throw new InstallationError('device', (error as Error).message, { cause: error });
  }
}

/** A block device's logical block size from sysfs; 512 for a file standing in for a disk. */
async function logicalBlockSize(device: string): Promise<number> {
  try {
    if (!(await stat(device)).isBlockDevice()) return 512;
    const name = path.basename(await realpath(device));
    return Number((await readFile(`/sys/class/block/${name}/queue/logical_block_size`, 'utf8')).trim()) || 512;
  } catch {
    return 512;
  }
}

/** The request's hints, checked, with its root_device as the device_name hint when given. */
function hintsOf(given: RootDeviceHintsMessage, devicePath: string): RootDeviceHints {
  const { $typeName: _, ...fields } = given;
  const set = Object.fromEntries(
    Object.entries({ ...fields, ...(devicePath !== '' && { deviceName: devicePath }) }).filter(
      ([, value]) => value !== '' && value !== 0 && value !== undefined,
    ),
  );
  try {
    return parseRootDeviceHints(set);
  } catch (error) {
    throw new InstallationError('request', (error as Error).message, { cause: error });
  }
}

async function present(file: string): Promise<boolean> {
  try {
    await access(file);
    return true;
  } catch {
    return false;
  }
}
