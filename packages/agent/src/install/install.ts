import { access } from 'node:fs/promises';
import path from 'node:path';
import type { OSInstallationRequest } from '@bmaas/api/cloud/agent/api/agent_pb';
import {
  DiskImageInstallationRequest_Compression as Compression,
  type DiskImageInstallationRequest,
  type RootDeviceHints as RootDeviceHintsMessage,
} from '@bmaas/api/cloud/agent/api/disk_image_pb';
import type { DiskRecord } from '../hardware/disks.js';
import { readDisks } from '../hardware/disks.js';
import { readNics } from '../hardware/nics.js';
import type { NetworkConfig } from '../network/config.js';
import {
  chooseRootDevice,
  noHints,
  parseRootDeviceHints,
  type RootDeviceHints,
  RootDeviceNotFoundError,
} from '../root-device-hints.js';
import type { ConfigDriveContents } from './config-drive.js';
import { addBootEntryForDisk, removeInstalledOsEntries } from './efi-boot.js';
import { InstallationError } from './errors.js';
import { networkData } from './network-data.js';
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
  /** The longest the image's server may stay silent, in milliseconds (60 s unless given). */
  readonly idleTimeoutMs?: number | undefined;
  /**
   * The installed OS's first boot: a config drive is written (see
   * `config-drive.ts`) with the request's hostname (the machine ID if it
   * gives none), SSH keys, user data and network (DHCP on each NIC if it
   * gives none), and the phone home; none when absent.
   */
  readonly firstBoot?: FirstBootSettings | undefined;
}

/** What the agent, not the request, knows of the installed OS's first boot. */
export interface FirstBootSettings {
  /** The machine's BMDB UUID: the OS's instance ID. */
  readonly machineId: string;
  /** Where the OS reports its first boot, the installation's secret in it; and the CA (PEM) it trusts it by. */
  readonly phoneHome: ConfigDriveContents['phoneHome'];
}

/** The description of every boot entry an installation adds, before the disk's name: how the agent finds its own. */
export const BOOT_ENTRY_DESCRIPTION = 'BMaaS installed OS';

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
 * request names, which must be one of the machine's whole disks (as the
 * hardware report lists them): by path (a `deviceName` hint: /dev/sda or a
 * /dev/disk/by-path link) or by hints. On a UEFI machine, the boot entries
 * earlier installations added are removed before the write starts, and a
 * new one for the image goes first in BootOrder after it. With
 * `firstBoot`, the installed OS gets a config drive (`config-drive.ts`),
 * written after the image's body and before its head.
 *
 * @throws {@link InstallationError} for a request of another kind or without
 *   a device, a device that is not a whole disk of the machine, hints that
 *   match no disk or several (or that this agent does not know), and every
 *   failure of {@link writeDiskImage} and {@link addBootEntryForDisk}
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
  const efivars = options.efivars !== undefined && (await present(options.efivars)) ? options.efivars : undefined;
  // Before the write: an entry naming the old ESP by its GUID must not boot what is half written.
  if (efivars !== undefined) await removeInstalledOsEntries(efivars, BOOT_ENTRY_DESCRIPTION);
  const contents = options.firstBoot && (await configDriveContents(image, options.firstBoot, root, generation));
  const { bytes } = await writeDiskImage(
    {
      url: image.url,
      sha256: image.sha256,
      compression: image.compression === Compression.GZIP ? 'gzip' : 'none',
    },
    target.path,
    {
      ca: options.ca,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      idleTimeoutMs: options.idleTimeoutMs,
      configDrive: contents && { contents, blockSize: target.logicalBlockSize },
    },
  );
  if (efivars === undefined) return { device: target.path, bytes };
  const bootEntry = await addBootEntryForDisk(
    efivars,
    target.path,
    target.logicalBlockSize,
    `${BOOT_ENTRY_DESCRIPTION} (${path.basename(target.path)})`,
  );
  return { device: target.path, bytes, bootEntry };
}

/**
 * The disk to write: the one whole disk of the machine (under `root`) that
 * the request's path and hints match; the path alone is a `deviceName` hint.
 */
async function rootDevice(
  devicePath: string,
  given: RootDeviceHintsMessage | undefined,
  root: string,
  generation: bigint,
): Promise<Pick<DiskRecord, 'path' | 'logicalBlockSize'>> {
  if (given === undefined && devicePath === '') {
    throw new InstallationError('request', `installation request of generation ${generation} names no root device`);
  }
  const hints = hintsOf(given, devicePath, generation);
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
    if (given === undefined && error instanceof RootDeviceNotFoundError) {
      throw new InstallationError(
        'device',
        `root device ${devicePath} of generation ${generation} is not a whole disk of this machine (a partition, a dm or md device, a file are not); disks: ${
          error.seen.length === 0 ? 'none' : error.seen.join('; ')
        }`,
        { cause: error },
      );
    }
    throw new InstallationError('device', (error as Error).message, { cause: error });
  }
}

/**
 * The request's hints, checked, with its root_device as the device_name hint
 * when given. A hint this agent does not know (a newer server's, in the
 * message's unknown fields) is refused, naming its field number: left out,
 * it could let another disk match.
 */
function hintsOf(given: RootDeviceHintsMessage | undefined, devicePath: string, generation: bigint): RootDeviceHints {
  const unknown = [...new Set((given?.$unknown ?? []).map((field) => field.no))];
  if (unknown.length > 0) {
    throw new InstallationError(
      'request',
      `root device hints of generation ${generation} carry field ${unknown.join(', ')}, unknown to this agent (a newer server's hint): refused, as a hint left out could choose another disk; update the agent image`,
    );
  }
  const fields = {
    deviceName: devicePath !== '' ? devicePath : given?.deviceName,
    model: given?.model,
    vendor: given?.vendor,
    serialNumber: given?.serialNumber,
    wwn: given?.wwn,
    minSizeGigabytes: given?.minSizeGigabytes,
    rotational: given?.rotational,
  };
  const set = Object.fromEntries(
    Object.entries(fields).filter(([, value]) => value !== '' && value !== 0 && value !== undefined),
  );
  try {
    return parseRootDeviceHints(set);
  } catch (error) {
    throw new InstallationError('request', (error as Error).message, { cause: error });
  }
}

/**
 * The config drive's contents: the request's hostname, keys, user data and
 * network (its network_json, else DHCP on each of the machine's NICs).
 */
async function configDriveContents(
  image: DiskImageInstallationRequest,
  firstBoot: FirstBootSettings,
  root: string,
  generation: bigint,
): Promise<ConfigDriveContents> {
  let network: NetworkConfig | undefined;
  if (image.networkJson !== '') {
    try {
      network = JSON.parse(image.networkJson) as NetworkConfig;
      if (!Array.isArray(network.interfaces) || !Array.isArray(network.nameservers))
        throw new Error('no interfaces or nameservers');
    } catch (error) {
      throw new InstallationError(
        'request',
        `network_json of generation ${generation} is not a network configuration: ${(error as Error).message}`,
        { cause: error },
      );
    }
  }
  const macs = network === undefined ? (await readNics(root)).map((nic) => nic.mac).filter((mac) => mac !== '') : [];
  try {
    return {
      machineId: firstBoot.machineId,
      hostname: image.hostname !== '' ? image.hostname : firstBoot.machineId,
      sshPublicKeys: image.sshPublicKeys,
      userData: image.userData.length > 0 ? image.userData : undefined,
      networkData: networkData(network, macs),
      phoneHome: firstBoot.phoneHome,
    };
  } catch (error) {
    throw new InstallationError('request', `generation ${generation}: ${(error as Error).message}`, { cause: error });
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
