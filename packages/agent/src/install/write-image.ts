import { createHash } from 'node:crypto';
import type { FileHandle } from 'node:fs/promises';
import { open, readFile, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import { Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { download } from './download.js';
import { InstallationError } from './errors.js';

/** An image to write, as the disk image installation request gives it. */
export interface DiskImage {
  /** http:// or https:// URL of the image. */
  readonly url: string;
  /** sha256 of the image as downloaded (before decompression), 64 hex digits. */
  readonly sha256: string;
  /** How the image is compressed as downloaded. */
  readonly compression: 'none' | 'gzip';
}

/** How to write an image. */
export interface WriteImageOptions {
  /** PEM CA certificate trusted beside the system's for an https URL. */
  readonly ca?: string | undefined;
  /** Stops the installation (the disk is then wiped as after a failure). */
  readonly signal?: AbortSignal | undefined;
  /** The longest an installation may take, in milliseconds; 15 minutes by default. */
  readonly timeoutMs?: number | undefined;
}

/** What a successful write did. */
export interface WrittenImage {
  /** Bytes written to the device (the decompressed image). */
  readonly bytes: number;
  /** Bytes downloaded. */
  readonly downloaded: number;
}

/** The bound of an installation unless told otherwise: upstream's. */
export const DEFAULT_INSTALLATION_TIMEOUT_MS = 15 * 60_000;

/**
 * The bytes held back until the image's checksum is known: the MBR and a
 * GPT's primary header and partition entries (and a boot loader's first
 * stage) all live in the first MiB, so a disk whose image failed its check,
 * or whose write stopped, is never bootable.
 */
export const HEAD_BYTES = 1 << 20;

/**
 * Writes a disk image to `device` (a block device, or a regular file of the
 * disk's size standing in for one: it is never created or grown): downloads
 * it, decompresses it as asked, writes all but its first MiB in place,
 * checks the sha256 of what was downloaded, then writes the first MiB and
 * flushes the device. On any failure (download, a device too small, a
 * checksum mismatch, the time bound, `signal`), the first and last MiB of
 * the device are zeroed (a GPT's backup header is at the disk's end), so
 * neither a half-written image nor the disk's previous OS boots, and the
 * error is thrown.
 *
 * @throws {@link InstallationError} naming the device or URL and the step that failed
 */
export async function writeDiskImage(
  image: DiskImage,
  device: string,
  options: WriteImageOptions = {},
): Promise<WrittenImage> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_INSTALLATION_TIMEOUT_MS;
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  if (!/^[0-9a-fA-F]{64}$/.test(image.sha256)) {
    throw new InstallationError(
      'request',
      `sha256 ${JSON.stringify(image.sha256)} of ${image.url} is not 64 hex digits`,
    );
  }
  const capacity = await deviceSize(device);
  let handle: FileHandle;
  try {
    handle = await open(device, 'r+');
  } catch (error) {
    throw new InstallationError('device', `root device ${device} cannot be opened: ${(error as Error).message}`, {
      cause: error,
    });
  }
  try {
    return await writeImage({ image, device, handle, capacity, signal, ca: options.ca, timeout, timeoutMs });
  } catch (error) {
    await wipeEnds(handle, capacity);
    throw error;
  } finally {
    await handle.close().catch(() => {});
  }
}

/** One write under way: the image, the device open for it, and what bounds it. */
interface Writing {
  readonly image: DiskImage;
  readonly device: string;
  readonly handle: FileHandle;
  readonly capacity: number;
  /** The caller's signal and the time bound together. */
  readonly signal: AbortSignal;
  readonly ca: string | undefined;
  /** The time bound alone, to tell a timeout from a stop. */
  readonly timeout: AbortSignal;
  readonly timeoutMs: number;
}

/** Streams the image to the device, all but its first MiB; checks the sha256; then writes the first MiB and flushes. */
async function writeImage(writing: Writing): Promise<WrittenImage> {
  const { image, device, handle, capacity, signal, ca, timeout, timeoutMs } = writing;
  const head = Buffer.alloc(Math.min(HEAD_BYTES, capacity));
  let headLength = 0;
  let position = 0;
  let downloaded = 0;
  const hash = createHash('sha256');
  const hashed = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      hash.update(chunk);
      downloaded += chunk.length;
      done(null, chunk);
    },
  });
  // The chunks waiting while a write is under way arrive together (writev) and go to the disk in one write.
  const store = (chunks: readonly Buffer[], done: (error?: Error | null) => void) => {
    const length = chunks.reduce((sum, chunk) => sum + chunk.length, 0);
    if (position + length > capacity) {
      done(new InstallationError('too-large', `root device ${device} holds ${capacity} bytes; the image is larger`));
      return;
    }
    const bytes = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, length);
    // The first MiB goes to memory; the rest to the disk, at its place.
    const intoHead = Math.max(0, Math.min(length, HEAD_BYTES - position));
    if (intoHead > 0) {
      bytes.copy(head, position, 0, intoHead);
      headLength = position + intoHead;
    }
    const rest = bytes.subarray(intoHead);
    const at = position + intoHead;
    position += length;
    if (rest.length === 0) done();
    else writeFully(handle, rest, at).then(() => done(), done);
  };
  const disk = new Writable({
    highWaterMark: 4 << 20,
    write: (chunk: Buffer, _encoding, done) => store([chunk], done),
    writev: (chunks, done) =>
      store(
        chunks.map(({ chunk }) => chunk as Buffer),
        done,
      ),
  });
  try {
    const response = await download(image.url, ca, signal);
    await pipeline(response, hashed, ...(image.compression === 'gzip' ? [createGunzip()] : []), disk, { signal });
  } catch (error) {
    if (timeout.aborted) {
      throw new InstallationError(
        'timeout',
        `installation of ${image.url} onto ${device} took longer than ${timeoutMs / 1000} s`,
        { cause: error },
      );
    }
    if (signal.aborted) {
      throw new InstallationError('stopped', `installation of ${image.url} onto ${device} stopped`, { cause: error });
    }
    if (error instanceof InstallationError) throw error;
    throw new InstallationError('write', `writing ${image.url} onto ${device} failed: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const got = hash.digest('hex');
  if (got !== image.sha256.toLowerCase()) {
    throw new InstallationError(
      'sha256-mismatch',
      `sha256 of ${image.url} is ${got}, want ${image.sha256.toLowerCase()}; ${device} wiped`,
    );
  }
  await writeFully(handle, head.subarray(0, headLength), 0);
  await handle.sync();
  return { bytes: position, downloaded };
}

async function writeFully(handle: FileHandle, bytes: Uint8Array, at: number): Promise<void> {
  let done = 0;
  while (done < bytes.length) {
    const { bytesWritten } = await handle.write(bytes, done, bytes.length - done, at + done);
    done += bytesWritten;
  }
}

/** Zeroes the first and last MiB of the device and flushes it; best effort, as it runs after a failure. */
async function wipeEnds(handle: FileHandle, capacity: number): Promise<void> {
  const length = Math.min(HEAD_BYTES, capacity);
  const zeros = Buffer.alloc(length);
  await writeFully(handle, zeros, 0).catch(() => {});
  await writeFully(handle, zeros, capacity - length).catch(() => {});
  await handle.sync().catch(() => {});
}

/**
 * The bytes a device holds: a block device's from sysfs, a regular file's
 * (the stand-in for a disk) its size.
 *
 * @throws {@link InstallationError} (`device`) when it is missing or neither
 */
export async function deviceSize(device: string): Promise<number> {
  let info: Awaited<ReturnType<typeof stat>>;
  try {
    info = await stat(device);
  } catch (error) {
    throw new InstallationError('device', `root device ${device} missing: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (info.isFile()) return info.size;
  if (!info.isBlockDevice()) {
    throw new InstallationError('device', `root device ${device} is neither a block device nor a file`);
  }
  const name = path.basename(await realpath(device));
  const sectors = Number((await readFile(`/sys/class/block/${name}/size`, 'utf8')).trim());
  return sectors * 512;
}
