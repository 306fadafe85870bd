import { exists, linkName, listNames, readBytes, readInteger, readText } from './files.js';

/** How a disk is attached, as the hardware report's BlockDevice.Protocol names it, plus virtio. */
export type DiskProtocol = 'scsi' | 'ata' | 'nvme' | 'mmc' | 'virtio';

/** What the kernel tells of a disk's health; each field absent where it tells nothing. */
export interface DiskHealth {
  /**
   * NVMe: a temperature alarm of the controller's hwmon is raised (its critical warning's temperature bit);
   * behind a multipath subsystem, of any of its controllers. Absent where no controller has hwmon.
   */
  readonly criticalWarning?: boolean;
}

/** One whole disk (no partitions), from /sys/class/block. */
export interface DiskRecord {
  /** The kernel's name: sda, nvme0n1, vda, mmcblk0. */
  readonly name: string;
  /** /dev/<name>. */
  readonly path: string;
  readonly protocol: DiskProtocol;
  readonly vendor: string;
  readonly model: string;
  readonly serialNumber: string;
  /** The World Wide Name as 0x and lower-case hex (from an naa. or eui. wwid), or '' where there is none. */
  readonly wwn: string;
  readonly rotational: boolean;
  readonly sizeBytes: number;
  readonly logicalBlockSize: number;
  readonly physicalBlockSize: number;
  /** The /dev/disk/by-path links naming this disk (udev's; none where udev did not run). */
  readonly byPath: readonly string[];
  readonly health: DiskHealth;
}

/** How a disk's identity is read: sd disks are SCSI or ATA (behind libata), told apart by their vendor. */
type DiskKind = 'sd' | 'nvme' | 'virtio' | 'mmc';

/** Kernel names of the disks the report covers; loop, ram, zram, dm, md, sr, nbd devices are not disks to install on. */
const DISK_NAMES: readonly [RegExp, DiskKind][] = [
  [/^sd[a-z]+$/, 'sd'],
  [/^nvme\d+n\d+$/, 'nvme'],
  [/^vd[a-z]+$/, 'virtio'],
  [/^mmcblk\d+$/, 'mmc'],
];

/** Every disk of the machine under `root`, in name order. */
export async function readDisks(root: string, warnings: string[]): Promise<DiskRecord[]> {
  const byPath = await byPathLinks(root);
  const disks: DiskRecord[] = [];
  for (const name of await listNames(root, 'sys/class/block')) {
    const kind = DISK_NAMES.find(([pattern]) => pattern.test(name))?.[1];
    if (kind === undefined) continue;
    const dir = `sys/class/block/${name}`;
    if (await exists(root, `${dir}/partition`)) continue;
    const sectors = await readInteger(root, `${dir}/size`);
    if (sectors === undefined) {
      warnings.push(`disk ${name}: /${dir}/size unreadable; left out`);
      continue;
    }
    const identity = await identityOf(root, name, kind);
    if (identity.protocol === 'nvme' && identity.health.criticalWarning === undefined) {
      warnings.push(
        `disk ${name}: no controller of it has an NVMe temperature alarm (hwmon): its health is unknown, reported as no critical warning (the report's critical_warning cannot say unknown)`,
      );
    }
    disks.push({
      name,
      path: `/dev/${name}`,
      ...identity,
      rotational: (await readText(root, `${dir}/queue/rotational`)) === '1',
      // The kernel counts a disk's size in 512-byte sectors whatever its block sizes.
      sizeBytes: sectors * 512,
      logicalBlockSize: (await readInteger(root, `${dir}/queue/logical_block_size`)) ?? 512,
      physicalBlockSize: (await readInteger(root, `${dir}/queue/physical_block_size`)) ?? 512,
      byPath: byPath.get(name) ?? [],
    });
  }
  return disks;
}

async function identityOf(
  root: string,
  name: string,
  kind: DiskKind,
): Promise<Pick<DiskRecord, 'protocol' | 'vendor' | 'model' | 'serialNumber' | 'wwn' | 'health'>> {
  const device = `sys/class/block/${name}/device`;
  switch (kind) {
    case 'sd': {
      const vendor = (await readText(root, `${device}/vendor`)) ?? '';
      // SAT (SCSI/ATA translation): an ATA disk behind libata answers INQUIRY with the vendor "ATA".
      const ata = vendor === 'ATA';
      return {
        protocol: ata ? 'ata' : 'scsi',
        vendor: ata ? '' : vendor,
        model: (await readText(root, `${device}/model`)) ?? '',
        serialNumber: await unitSerialNumber(root, device),
        wwn: wwnOf(await readText(root, `${device}/wwid`)),
        health: {},
      };
    }
    case 'nvme': {
      // The namespace's device is its controller, which holds the model and serial; under native
      // multipath it is the subsystem (which holds them too), and the alarms are its controllers'.
      const controllers = await subsystemControllers(root, device);
      const alarms = await anyAlarm(root, controllers.length > 0 ? controllers : [device]);
      return {
        protocol: 'nvme',
        vendor: '',
        model: (await readText(root, `${device}/model`)) ?? '',
        serialNumber: (await readText(root, `${device}/serial`)) ?? '',
        wwn: wwnOf(await readText(root, `sys/class/block/${name}/wwid`)),
        health: alarms === undefined ? {} : { criticalWarning: alarms },
      };
    }
    case 'virtio':
      return {
        protocol: 'virtio',
        vendor: '',
        model: '',
        serialNumber: (await readText(root, `sys/class/block/${name}/serial`)) ?? '',
        wwn: '',
        health: {},
      };
    case 'mmc':
      return {
        protocol: 'mmc',
        vendor: '',
        model: (await readText(root, `${device}/name`)) ?? '',
        serialNumber: (await readText(root, `${device}/serial`)) ?? '',
        wwn: '',
        health: {},
      };
  }
}

/** The serial number of a SCSI disk's Unit Serial Number VPD page (0x80): a 4-byte header, then ASCII. */
async function unitSerialNumber(root: string, device: string): Promise<string> {
  const page = await readBytes(root, `${device}/vpd_pg80`);
  if (page === undefined || page.length < 4 || page[1] !== 0x80) return '';
  const length = ((page[2] as number) << 8) | (page[3] as number);
  return Buffer.from(page.subarray(4, 4 + length))
    .toString('latin1')
    .replace(/\0/g, '')
    .trim();
}

/** 0x and the hex of an NAA or EUI-64 identifier; '' for any other wwid (t10., nvme.). */
export function wwnOf(wwid: string | undefined): string {
  const match = wwid && /^(?:naa|eui)\.([0-9a-fA-F]+)$/.exec(wwid);
  return match ? `0x${(match[1] as string).toLowerCase()}` : '';
}

/**
 * The controllers of an NVMe subsystem (`nvme-subsysN`, the device of a
 * namespace under native multipath): its links named `nvmeN`. None for a
 * controller, whose own entries are its namespaces (`nvme0n1`) and `ng0n1`.
 */
async function subsystemControllers(root: string, device: string): Promise<string[]> {
  return (await listNames(root, device)).filter((name) => /^nvme\d+$/.test(name)).map((name) => `${device}/${name}`);
}

/**
 * Whether any temperature alarm of the NVMe controllers' hwmon is raised;
 * undefined when none of them has one (a subsystem or an older kernel
 * without hwmon: the health is unknown, not good).
 */
async function anyAlarm(root: string, controllers: readonly string[]): Promise<boolean | undefined> {
  let seen = false;
  for (const controller of controllers) {
    for (const hwmon of await listNames(root, `${controller}/hwmon`)) {
      for (const file of await listNames(root, `${controller}/hwmon/${hwmon}`)) {
        if (!/^temp\d+_(?:crit_)?alarm$/.test(file)) continue;
        seen = true;
        if ((await readText(root, `${controller}/hwmon/${hwmon}/${file}`)) === '1') return true;
      }
    }
  }
  return seen ? false : undefined;
}

/** udev's /dev/disk/by-path links, by the disk name they point at. */
async function byPathLinks(root: string): Promise<Map<string, string[]>> {
  const links = new Map<string, string[]>();
  for (const link of await listNames(root, 'dev/disk/by-path')) {
    const target = await linkName(root, `dev/disk/by-path/${link}`);
    if (target === undefined) continue;
    links.set(target, [...(links.get(target) ?? []), `/dev/disk/by-path/${link}`]);
  }
  return links;
}
