import type { FileHandle } from 'node:fs/promises';
import { isUuid } from '@bmaas/common';

/** One partition of a GUID partition table. */
export interface GptPartition {
  /** Its 1-based number (its entry's index + 1), as the kernel and UEFI count partitions. */
  readonly number: number;
  /** Its type, as a GUID string in upper case. */
  readonly type: string;
  /** Its unique GUID, as stored on disk (mixed-endian, as UEFI device paths want it). */
  readonly uniqueGuid: Uint8Array;
  readonly firstLba: bigint;
  readonly lastLba: bigint;
}

/** The type GUID of an EFI system partition. */
export const ESP_TYPE = 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B';

/** The disk holds no readable GPT. */
export class GptError extends Error {
  override name = 'GptError';
}

/**
 * The partitions of the GPT on a disk with `blockSize`-byte logical blocks:
 * its primary header at LBA 1 and the entries it points to.
 *
 * @throws {@link GptError} when LBA 1 holds no GPT header
 */
export async function readGpt(handle: FileHandle, blockSize: number, device: string): Promise<GptPartition[]> {
  const header = Buffer.alloc(92);
  await handle.read(header, 0, header.length, blockSize);
  if (header.toString('latin1', 0, 8) !== 'EFI PART') throw new GptError(`${device} has no GPT header at LBA 1`);
  const entriesLba = header.readBigUInt64LE(72);
  const count = header.readUInt32LE(80);
  const entrySize = header.readUInt32LE(84);
  if (entrySize < 128 || count > 1024) {
    throw new GptError(`${device}: GPT header has ${count} entries of ${entrySize} bytes`);
  }
  const entries = Buffer.alloc(count * entrySize);
  await handle.read(entries, 0, entries.length, Number(entriesLba) * blockSize);
  const partitions: GptPartition[] = [];
  for (let i = 0; i < count; i++) {
    const entry = entries.subarray(i * entrySize, (i + 1) * entrySize);
    const type = entry.subarray(0, 16);
    if (type.every((byte) => byte === 0)) continue;
    partitions.push({
      number: i + 1,
      type: guidString(type),
      uniqueGuid: Uint8Array.from(entry.subarray(16, 32)),
      firstLba: entry.readBigUInt64LE(32),
      lastLba: entry.readBigUInt64LE(40),
    });
  }
  return partitions;
}

/** A GUID's 16 mixed-endian bytes (the first three fields little-endian) as the string form. */
export function guidString(bytes: Uint8Array): string {
  const b = Buffer.from(bytes);
  const hex = (from: number, to: number) => b.subarray(from, to).toString('hex');
  return [
    b.readUInt32LE(0).toString(16).padStart(8, '0'),
    b.readUInt16LE(4).toString(16).padStart(4, '0'),
    b.readUInt16LE(6).toString(16).padStart(4, '0'),
    hex(8, 10),
    hex(10, 16),
  ]
    .join('-')
    .toUpperCase();
}

/** The string form of a GUID as its 16 mixed-endian bytes. */
export function guidBytes(guid: string): Uint8Array {
  if (!isUuid(guid)) throw new GptError(`${JSON.stringify(guid)} is not a GUID`);
  const [time = '', mid = '', high = '', clock = '', node = ''] = guid.split('-');
  const bytes = Buffer.alloc(16);
  bytes.writeUInt32LE(Number.parseInt(time, 16), 0);
  bytes.writeUInt16LE(Number.parseInt(mid, 16), 4);
  bytes.writeUInt16LE(Number.parseInt(high, 16), 6);
  Buffer.from(`${clock}${node}`, 'hex').copy(bytes, 8);
  return Uint8Array.from(bytes);
}
