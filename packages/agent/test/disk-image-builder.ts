import { crc32 } from 'node:zlib';
import { guidBytes } from '../src/install/gpt.js';

/** The GPT partition type of an EFI system partition, and of Linux filesystem data. */
export const ESP_TYPE_GUID = 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B';
export const LINUX_TYPE_GUID = '0FC63DAF-8483-4772-8E79-3D69D8477DE4';

/** A partition to lay out: its type, unique GUID and LBAs (of the image's blocks, 512 bytes unless given). */
export interface PartitionSpec {
  readonly type: string;
  readonly guid: string;
  readonly firstLba: number;
  readonly lastLba: number;
}

/**
 * A whole-disk image of `bytes` (a multiple of `blockSize`, 512 unless
 * given) with a protective MBR and a GPT (primary and backup headers, 128
 * entries of 128 bytes, CRCs set) of `partitions`, the rest filled with a
 * pattern so that its bytes are not mistaken for zeros or for another image.
 */
export function gptDiskImage(
  bytes: number,
  partitions: readonly PartitionSpec[],
  pattern = 0x5a,
  blockSize = 512,
): Buffer {
  const image = Buffer.alloc(bytes, pattern);
  const lbas = bytes / blockSize;
  const entryBlocks = (128 * 128) / blockSize;
  image.fill(0, 0, (2 + entryBlocks) * blockSize);
  image.fill(0, bytes - (1 + entryBlocks) * blockSize);
  // Protective MBR: one partition of type 0xEE over the disk.
  image[446 + 4] = 0xee;
  image.writeUInt32LE(1, 446 + 8);
  image.writeUInt32LE(Math.min(lbas - 1, 0xffffffff), 446 + 12);
  image.writeUInt16LE(0xaa55, 510);
  const entries = Buffer.alloc(128 * 128);
  partitions.forEach((partition, i) => {
    const entry = entries.subarray(i * 128, (i + 1) * 128);
    Buffer.from(guidBytes(partition.type)).copy(entry, 0);
    Buffer.from(guidBytes(partition.guid)).copy(entry, 16);
    entry.writeBigUInt64LE(BigInt(partition.firstLba), 32);
    entry.writeBigUInt64LE(BigInt(partition.lastLba), 40);
    entry.write('part', 56, 'utf16le');
  });
  const header = (current: number, backup: number, entriesLba: number) => {
    const h = Buffer.alloc(92);
    h.write('EFI PART', 0, 'latin1');
    h.writeUInt32LE(0x00010000, 8);
    h.writeUInt32LE(92, 12);
    h.writeBigUInt64LE(BigInt(current), 24);
    h.writeBigUInt64LE(BigInt(backup), 32);
    h.writeBigUInt64LE(BigInt(2 + entryBlocks), 40);
    h.writeBigUInt64LE(BigInt(lbas - 2 - entryBlocks), 48);
    Buffer.from(guidBytes('4D1B0C3A-0000-4000-8000-000000000001')).copy(h, 56);
    h.writeBigUInt64LE(BigInt(entriesLba), 72);
    h.writeUInt32LE(128, 80);
    h.writeUInt32LE(128, 84);
    h.writeUInt32LE(crc32(entries), 88);
    h.writeUInt32LE(crc32(h), 16);
    return h;
  };
  header(1, lbas - 1, 2).copy(image, blockSize);
  entries.copy(image, 2 * blockSize);
  entries.copy(image, (lbas - 1 - entryBlocks) * blockSize);
  header(lbas - 1, 1, lbas - 1 - entryBlocks).copy(image, (lbas - 1) * blockSize);
  return image;
}
