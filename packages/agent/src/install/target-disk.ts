import { constants } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { open, readFile, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import { InstallationError } from './errors.js';

/**
 * The bytes held back until the image's checksum is known, and zeroed at
 * each end before anything else is written: the MBR and a GPT's primary
 * header and partition entries (and a boot loader's first stage) all live in
 * the first MiB, a GPT's backup header and entries in the last.
 */
export const HEAD_BYTES = 1 << 20;

/**
 * A disk an image is written to, in the one order that never leaves it
 * bootable half-written: {@link zeroEnds} (flushed) before the first byte of
 * the image; the image past its first MiB with {@link write} (its first MiB
 * kept in memory); then {@link commit}: flush the body, write the first MiB,
 * flush again. A block device is opened exclusively (O_EXCL): the kernel
 * refuses it while a partition of it is mounted or another program holds it.
 */
export class TargetDisk {
  readonly #head: Buffer;
  #headLength = 0;

  private constructor(
    /** The device (or the regular file standing in for one), as named. */
    readonly device: string,
    readonly handle: FileHandle,
    /** Its size in bytes. */
    readonly capacity: number,
  ) {
    this.#head = Buffer.alloc(Math.min(HEAD_BYTES, capacity));
  }

  /**
   * Opens `device` for writing: a block device exclusively, a regular file
   * (a test's stand-in for a disk) as it is; it is never created or grown.
   *
   * @throws {@link InstallationError} (`device`) when it is missing, neither,
   *   or busy (mounted, or held by another program)
   */
  static async open(device: string): Promise<TargetDisk> {
    const { capacity, block } = await deviceSize(device);
    let handle: FileHandle;
    try {
      handle = await open(device, constants.O_RDWR | (block ? constants.O_EXCL : 0));
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      const why =
        code === 'EBUSY'
          ? 'it is in use (a partition of it is mounted, or another program holds it)'
          : (error as Error).message;
      throw new InstallationError('device', `root device ${device} cannot be opened exclusively: ${why}`, {
        cause: error,
      });
    }
    return new TargetDisk(device, handle, capacity);
  }

  /** Zeroes the first and last MiB and flushes them, so that neither the old OS nor a half-written image boots. */
  async zeroEnds(): Promise<void> {
    const zeros = Buffer.alloc(this.#head.length);
    await writeFully(this.handle, zeros, 0);
    await writeFully(this.handle, zeros, this.capacity - zeros.length);
    await this.handle.sync();
  }

  /**
   * Writes `bytes` of the image at `offset`: what falls in the first MiB to
   * memory, until {@link commit}; the rest to the disk.
   *
   * @throws {@link InstallationError} (`too-large`) past the disk's end
   */
  async write(offset: number, bytes: Uint8Array): Promise<void> {
    if (offset + bytes.length > this.capacity) {
      throw new InstallationError(
        'too-large',
        `root device ${this.device} holds ${this.capacity} bytes; the image is larger`,
      );
    }
    const intoHead = Math.max(0, Math.min(bytes.length, HEAD_BYTES - offset));
    if (intoHead > 0) {
      this.#head.set(bytes.subarray(0, intoHead), offset);
      this.#headLength = Math.max(this.#headLength, offset + intoHead);
    }
    if (intoHead < bytes.length) await writeFully(this.handle, bytes.subarray(intoHead), offset + intoHead);
  }

  /** Makes the image's first `length` bytes count as written where nothing was (a sparse image's zeros). */
  extendHead(length: number): void {
    this.#headLength = Math.max(this.#headLength, Math.min(length, this.#head.length));
  }

  /** The image's first bytes as held back so far (a copy). */
  get head(): Buffer {
    return Buffer.from(this.#head.subarray(0, this.#headLength));
  }

  /** Replaces the held-back first bytes (the config drive's partition added): as long as {@link head}, or shorter. */
  replaceHead(bytes: Uint8Array): void {
    if (bytes.length > this.#headLength) {
      throw new InstallationError(
        'write',
        `${this.device}: a new head of ${bytes.length} bytes for one of ${this.#headLength}`,
      );
    }
    this.#head.set(bytes, 0);
  }

  /** Flushes the body, then writes the first MiB and flushes again: the image is bootable only once whole. */
  async commit(): Promise<void> {
    await this.handle.sync();
    await writeFully(this.handle, this.#head.subarray(0, this.#headLength), 0);
    await this.handle.sync();
  }

  /** Zeroes both ends again after a failure (the image may have reached the last MiB); best effort. */
  async wipeAfterFailure(): Promise<void> {
    await this.zeroEnds().catch(() => {});
  }

  async close(): Promise<void> {
    await this.handle.close().catch(() => {});
  }
}

export async function writeFully(handle: FileHandle, bytes: Uint8Array, at: number): Promise<void> {
  let done = 0;
  while (done < bytes.length) {
    const { bytesWritten } = await handle.write(bytes, done, bytes.length - done, at + done);
    done += bytesWritten;
  }
}

/**
 * The bytes a device holds: a block device's from sysfs, a regular file's
 * (the stand-in for a disk) its size.
 *
 * @throws {@link InstallationError} (`device`) when it is missing or neither
 */
export async function deviceSize(device: string): Promise<{ capacity: number; block: boolean }> {
  let info: Awaited<ReturnType<typeof stat>>;
  try {
    info = await stat(device);
  } catch (error) {
    throw new InstallationError('device', `root device ${device} missing: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (info.isFile()) return { capacity: info.size, block: false };
  if (!info.isBlockDevice()) {
    throw new InstallationError('device', `root device ${device} is neither a block device nor a file`);
  }
  const name = path.basename(await realpath(device));
  const sectors = Number((await readFile(`/sys/class/block/${name}/size`, 'utf8')).trim());
  return { capacity: sectors * 512, block: true };
}
