import { randomBytes, randomUUID } from 'node:crypto';
import { type FileHandle, open } from 'node:fs/promises';
import { crc32 } from 'node:zlib';
import { type FatFile, fatImage } from './fat.js';
import { guidBytes } from './gpt.js';
import type { NetworkData } from './network-data.js';

// The installed OS's first boot, as Ironic hands it over for a whole-disk image: a partition at
// the disk's end labelled config-2 (VFAT) holding OpenStack's openstack/latest/ files, which
// cloud-init's ConfigDrive source reads unmodified.

/** What the installed OS is told on its first boot. */
export interface ConfigDriveContents {
  /** The machine's BMDB UUID: cloud-init's instance ID. */
  readonly machineId: string;
  readonly hostname: string;
  /** OpenSSH public keys (`ssh-ed25519 AAAA… comment`), for the default user. */
  readonly sshPublicKeys: readonly string[];
  /** cloud-init user data, as given; none written when undefined. */
  readonly userData: Uint8Array | undefined;
  readonly networkData: NetworkData;
  /**
   * Where the OS reports its first boot (cloud-init's `phone_home`, in the
   * vendor data), and the CA certificate (PEM) it trusts that server by
   * (cloud-init's `ca_certs`), when the server's certificate is not one a
   * distribution trusts. The URL holds the installation's secret.
   */
  readonly phoneHome?: { readonly url: string; readonly caCertificate: string | undefined } | undefined;
}

/** Where a config drive goes and what the write sequence has of the image's head. */
export interface ConfigDriveTarget {
  /** The disk: a block device, or a regular file standing in for one. */
  readonly disk: string;
  /** The disk open for writing (the write sequence's); opened from `disk` when absent. */
  readonly handle?: FileHandle | undefined;
  /** The disk's size in bytes. */
  readonly diskBytes: number;
  /** Its logical block size (512 unless given). */
  readonly blockSize?: number | undefined;
  /**
   * The image's first bytes, not yet on the disk (the write sequence writes
   * them last): its MBR and primary GPT, entries included.
   */
  readonly head: Uint8Array;
}

/** The disk or its image leaves no way to add the config drive. */
export class ConfigDriveError extends Error {
  override name = 'ConfigDriveError';
}

/** The partition's size, as Ironic makes it (64 MiB). */
export const CONFIG_DRIVE_BYTES = 64 * 2 ** 20;
/** Its file system label, which cloud-init looks for. */
export const CONFIG_DRIVE_LABEL = 'config-2';
/** Microsoft basic data: a FAT partition's GPT type. */
const BASIC_DATA_TYPE = 'EBD0A0A2-B9E5-4433-87C0-68B6B72699C7';
/** FAT16 with LBA addressing: its MBR type. */
const MBR_FAT16_LBA = 0x0e;
const ALIGNMENT = 2 ** 20;

/**
 * The config drive's files, as Nova writes them: `openstack/latest/`
 * `meta_data.json` (uuid, hostname, name, public_keys), `network_data.json`,
 * `user_data` when there is one, and `vendor_data.json` with cloud-init's
 * `phone_home` (and `ca_certs`) when a phone home is given.
 */
export function configDriveFiles(contents: ConfigDriveContents): FatFile[] {
  const keys = Object.fromEntries(contents.sshPublicKeys.map((key, i) => [`key-${i}`, key]));
  const metaData = {
    uuid: contents.machineId,
    hostname: contents.hostname,
    name: contents.hostname,
    launch_index: 0,
    public_keys: keys,
    keys: Object.entries(keys).map(([name, data]) => ({ name, type: 'ssh', data })),
  };
  const json = (value: unknown) => Buffer.from(`${JSON.stringify(value, null, 2)}\n`);
  const files: FatFile[] = [
    { path: 'openstack/latest/meta_data.json', contents: json(metaData) },
    { path: 'openstack/latest/network_data.json', contents: json(contents.networkData) },
  ];
  if (contents.userData !== undefined) files.push({ path: 'openstack/latest/user_data', contents: contents.userData });
  if (contents.phoneHome !== undefined) {
    const cloudConfig = {
      phone_home: { url: contents.phoneHome.url, post: 'all', tries: 10 },
      ...(contents.phoneHome.caCertificate !== undefined && {
        ca_certs: { trusted: [contents.phoneHome.caCertificate] },
      }),
    };
    // JSON is YAML: cloud-config in the vendor data's `cloud-init` key, as Nova's vendordata does it.
    files.push({
      path: 'openstack/latest/vendor_data.json',
      contents: json({ 'cloud-init': `#cloud-config\n${JSON.stringify(cloudConfig)}\n` }),
    });
  }
  return files;
}

/**
 * Makes the config drive on a disk holding an image's body: a 64 MiB
 * partition at the disk's end (1 MiB aligned) with a VFAT file system
 * labelled `config-2` holding {@link configDriveFiles}, written now; and
 * the image's head with that partition added, returned for the write
 * sequence to write last. On a GPT disk the partition takes the first free
 * entry, the primary header and the protective MBR grow to the disk's end,
 * and the backup GPT is written at the disk's end (the image's own backup
 * header, where the image ended, is zeroed). On an MBR disk it takes the
 * first free primary entry. Nothing of the image is changed on the disk but
 * the zeroed old backup header.
 *
 * @returns the head's new bytes, as long as `target.head`
 * @throws {@link ConfigDriveError} naming the disk when its head holds no partition table,
 *   the image leaves no 64 MiB free at its end, or every entry is taken
 */
export async function writeConfigDrive(target: ConfigDriveTarget, contents: ConfigDriveContents): Promise<Buffer> {
  const blockSize = target.blockSize ?? 512;
  const head = Buffer.from(target.head);
  const blocks = Math.floor(target.diskBytes / blockSize);
  const gpt = head.length >= 2 * blockSize && head.toString('latin1', blockSize, blockSize + 8) === 'EFI PART';
  if (!gpt && head.readUInt16LE(510) !== 0xaa55) {
    throw new ConfigDriveError(`${target.disk}: the image has neither a GPT nor an MBR`);
  }
  const layout = gpt ? gptLayout(target, head, blocks, blockSize) : mbrLayout(target, head, blocks, blockSize);
  const fat = fatImage({
    label: CONFIG_DRIVE_LABEL,
    files: configDriveFiles(contents),
    sectorSize: blockSize,
    totalSectors: layout.sizeBlocks,
    hiddenSectors: layout.firstLba,
    volumeId: randomBytes(4).readUInt32LE(0),
    time: new Date(),
  });
  const handle = target.handle ?? (await open(target.disk, 'r+'));
  try {
    for (const write of [{ at: layout.firstLba * blockSize, bytes: fat.bytes }, ...layout.writes]) {
      let done = 0;
      while (done < write.bytes.length) {
        done += (await handle.write(write.bytes, done, write.bytes.length - done, write.at + done)).bytesWritten;
      }
    }
    await handle.sync();
  } finally {
    if (target.handle === undefined) await handle.close();
  }
  return head;
}

interface Layout {
  readonly firstLba: number;
  readonly sizeBlocks: number;
  /** Bytes beyond the head to write: the backup GPT, the old backup header zeroed. */
  readonly writes: readonly { readonly at: number; readonly bytes: Buffer }[];
}

/** The last 1 MiB-aligned 64 MiB before `endLba` (exclusive), refused if it starts at or before `usedLba`. */
function place(target: ConfigDriveTarget, endLba: number, usedLba: number, blockSize: number) {
  const perMiB = ALIGNMENT / blockSize;
  const sizeBlocks = CONFIG_DRIVE_BYTES / blockSize;
  const firstLba = Math.floor(endLba / perMiB) * perMiB - sizeBlocks;
  if (firstLba <= usedLba) {
    throw new ConfigDriveError(
      `${target.disk}: no ${CONFIG_DRIVE_BYTES / 2 ** 20} MiB free after the image for the config drive (the image uses it up to block ${usedLba} of ${target.diskBytes / blockSize})`,
    );
  }
  return { firstLba, sizeBlocks };
}

/** The GPT with the config drive added, in `head`; the backup GPT to write at the disk's end. */
function gptLayout(target: ConfigDriveTarget, head: Buffer, blocks: number, blockSize: number): Layout {
  const header = head.subarray(blockSize, 2 * blockSize);
  const headerSize = header.readUInt32LE(12);
  const oldBackupLba = Number(header.readBigUInt64LE(32));
  const entriesLba = Number(header.readBigUInt64LE(72));
  const count = header.readUInt32LE(80);
  const entrySize = header.readUInt32LE(84);
  const entriesBytes = count * entrySize;
  const entryBlocks = Math.ceil(entriesBytes / blockSize);
  if (headerSize < 92 || headerSize > blockSize || entrySize < 128 || count === 0 || count > 1024) {
    throw new ConfigDriveError(`${target.disk}: the image's GPT header is malformed`);
  }
  if ((entriesLba + entryBlocks) * blockSize > head.length) {
    throw new ConfigDriveError(`${target.disk}: the image's GPT entries lie beyond its first ${head.length} bytes`);
  }
  const entries = head.subarray(entriesLba * blockSize, entriesLba * blockSize + entriesBytes);
  let used = Math.max(oldBackupLba, Number(header.readBigUInt64LE(48)));
  let free = -1;
  for (let i = 0; i < count; i++) {
    const entry = entries.subarray(i * entrySize, (i + 1) * entrySize);
    if (entry.subarray(0, 16).every((byte) => byte === 0)) {
      if (free === -1) free = i;
    } else used = Math.max(used, Number(entry.readBigUInt64LE(40)));
  }
  if (free === -1) throw new ConfigDriveError(`${target.disk}: every one of the image's ${count} GPT entries is taken`);
  const backupEntriesLba = blocks - 1 - entryBlocks;
  const lastUsable = backupEntriesLba - 1;
  const { firstLba, sizeBlocks } = place(target, lastUsable + 1, used, blockSize);

  const entry = entries.subarray(free * entrySize, (free + 1) * entrySize);
  entry.fill(0);
  Buffer.from(guidBytes(BASIC_DATA_TYPE)).copy(entry, 0);
  Buffer.from(guidBytes(randomUUID())).copy(entry, 16);
  entry.writeBigUInt64LE(BigInt(firstLba), 32);
  entry.writeBigUInt64LE(BigInt(firstLba + sizeBlocks - 1), 40);
  entry.write(CONFIG_DRIVE_LABEL, 56, 'utf16le');

  header.writeBigUInt64LE(BigInt(blocks - 1), 32);
  header.writeBigUInt64LE(BigInt(lastUsable), 48);
  header.writeUInt32LE(crc32(entries), 88);
  sealHeader(header, headerSize);
  // The protective MBR covers the whole disk now.
  head.writeUInt32LE(Math.min(blocks - 1, 0xffffffff), 446 + 12);

  const backup = Buffer.from(header.subarray(0, blockSize));
  backup.writeBigUInt64LE(BigInt(blocks - 1), 24);
  backup.writeBigUInt64LE(1n, 32);
  backup.writeBigUInt64LE(BigInt(backupEntriesLba), 72);
  sealHeader(backup, headerSize);
  const backupEntries = Buffer.alloc(entryBlocks * blockSize);
  entries.copy(backupEntries);
  const writes = [
    { at: backupEntriesLba * blockSize, bytes: backupEntries },
    { at: (blocks - 1) * blockSize, bytes: backup },
  ];
  // The image's own backup header, where the image ended, would pass for a second GPT's.
  if (oldBackupLba > 1 && oldBackupLba < firstLba) {
    writes.push({ at: oldBackupLba * blockSize, bytes: Buffer.alloc(blockSize) });
  }
  return { firstLba, sizeBlocks, writes };
}

function sealHeader(header: Buffer, headerSize: number): void {
  header.writeUInt32LE(0, 16);
  header.writeUInt32LE(crc32(header.subarray(0, headerSize)), 16);
}

/** The MBR with the config drive in its first free primary entry, in `head`. */
function mbrLayout(target: ConfigDriveTarget, head: Buffer, blocks: number, blockSize: number): Layout {
  let used = 0;
  let free = -1;
  for (let i = 0; i < 4; i++) {
    const at = 446 + i * 16;
    if (head[at + 4] === 0) {
      if (free === -1) free = i;
      continue;
    }
    used = Math.max(used, head.readUInt32LE(at + 8) + head.readUInt32LE(at + 12) - 1);
  }
  if (free === -1) throw new ConfigDriveError(`${target.disk}: every one of the image's 4 MBR entries is taken`);
  const { firstLba, sizeBlocks } = place(target, Math.min(blocks, 0xffffffff), used, blockSize);
  const at = 446 + free * 16;
  // CHS fields past what CHS can address: LBA alone counts.
  head.set([0x00, 0xfe, 0xff, 0xff, MBR_FAT16_LBA, 0xfe, 0xff, 0xff], at);
  head.writeUInt32LE(firstLba, at + 8);
  head.writeUInt32LE(sizeBlocks, at + 12);
  return { firstLba, sizeBlocks, writes: [] };
}
