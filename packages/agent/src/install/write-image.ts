import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { type Readable, Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { type ConfigDriveContents, writeConfigDrive } from './config-drive.js';
import { download } from './download.js';
import { InstallationError } from './errors.js';
import { decompressor, formatOf, type ImageFormat, MAGIC_BYTES } from './image-format.js';
import { mapQcow2, qcow2Writer } from './qcow2.js';
import { TargetDisk } from './target-disk.js';

export { HEAD_BYTES } from './target-disk.js';

/** An image to write, as the disk image installation request gives it. */
export interface DiskImage {
  /** http:// or https:// URL of the image; redirects to http(s) are followed. */
  readonly url: string;
  /** sha256 of the image as downloaded (before decompression), 64 hex digits. */
  readonly sha256: string;
  /**
   * What the request says of the image as downloaded: `gzip`, which it must
   * be; `none`, whatever its first bytes say (raw, gzip, xz, zstd or qcow2).
   */
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
  /** The longest the image's server may stay silent, in milliseconds; 60 s by default. */
  readonly idleTimeoutMs?: number | undefined;
  /**
   * The installed OS's config drive, made after the body is written and
   * checked and before the head (`config-drive.ts`); none when absent.
   */
  readonly configDrive?: { readonly contents: ConfigDriveContents; readonly blockSize: number } | undefined;
}

/** What a successful write did. */
export interface WrittenImage {
  /** Bytes written to the device (the decompressed image, a qcow2's whole disk). */
  readonly bytes: number;
  /** Bytes downloaded (a qcow2's metadata, read first, not counted). */
  readonly downloaded: number;
  /** How the image was stored, as its first bytes said. */
  readonly format: ImageFormat;
}

/** The bound of an installation unless told otherwise: upstream's. */
export const DEFAULT_INSTALLATION_TIMEOUT_MS = 15 * 60_000;

/**
 * Writes a disk image to `device` (a block device, opened exclusively, or a
 * regular file of the disk's size standing in for one: it is never created
 * or grown), in an order that never leaves the disk booting half an image:
 * first the device's first and last MiB are zeroed and flushed (the old
 * partition tables, both GPT headers, the boot loader's first stage); then
 * the image is downloaded and written past its first MiB, decompressed as
 * its first bytes say (gzip, xz, zstd; a qcow2 cluster by cluster, see
 * `qcow2.ts`); its sha256, of the bytes as downloaded, is checked; with
 * `configDrive`, the config drive's partition is written at the disk's end
 * (with the backup GPT) and added to the held-back head (`config-drive.ts`);
 * the body is flushed, and only then is the image's first MiB written and
 * flushed. On any failure (download, a device too small, a checksum
 * mismatch, no room for the config drive, the time bound, `signal`), both
 * ends are zeroed again, and the error is thrown.
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
  const disk = await TargetDisk.open(device);
  try {
    try {
      await disk.zeroEnds();
    } catch (error) {
      throw new InstallationError('write', `zeroing the ends of ${device} failed: ${(error as Error).message}`, {
        cause: error,
      });
    }
    return await writeImage({
      image,
      disk,
      signal,
      ca: options.ca,
      idleTimeoutMs: options.idleTimeoutMs,
      configDrive: options.configDrive,
    });
  } catch (error) {
    await disk.wipeAfterFailure();
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
  } finally {
    await disk.close();
  }
}

/** One write under way: the image, the disk open for it, and what bounds it. */
interface Writing {
  readonly image: DiskImage;
  readonly disk: TargetDisk;
  /** The caller's signal and the time bound together. */
  readonly signal: AbortSignal;
  readonly ca: string | undefined;
  readonly idleTimeoutMs: number | undefined;
  readonly configDrive: WriteImageOptions['configDrive'];
}

/**
 * Streams the image to the disk, all but its first MiB; checks the sha256;
 * makes the config drive (its partition added to the head held back); then
 * commits the first MiB.
 */
async function writeImage(writing: Writing): Promise<WrittenImage> {
  const { image, disk, signal, ca, idleTimeoutMs, configDrive } = writing;
  const fetch = { ca, signal, idleTimeoutMs };
  let downloaded = 0;
  const hash = createHash('sha256');
  const hashed = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      hash.update(chunk);
      downloaded += chunk.length;
      done(null, chunk);
    },
  });
  let response = await download(image.url, fetch);
  const format = formatOf(await firstBytes(response, MAGIC_BYTES));
  if (image.compression === 'gzip' && format !== 'gzip') {
    response.destroy();
    throw new InstallationError('format', `${image.url} was asked for as gzip, but its first bytes say ${format}`);
  }
  let bytes: number;
  if (format === 'qcow2') {
    // Its clusters' places come first, from range reads; then the file, once, front to back.
    response.destroy();
    const map = await mapQcow2((start, end) => readRange(image.url, start, end, fetch), image.url);
    const writer = qcow2Writer(map, disk, image.url);
    response = await download(image.url, fetch);
    await pipeline(response, hashed, writer, { signal });
    bytes = map.header.virtualSize;
  } else {
    const writer = new SequentialWriter(disk, image.url, format);
    await pipeline(response, hashed, ...(format === 'raw' ? [] : [decompressor(format, image.url)]), writer, {
      signal,
    });
    bytes = writer.position;
  }
  const got = hash.digest('hex');
  if (got !== image.sha256.toLowerCase()) {
    throw new InstallationError(
      'sha256-mismatch',
      `sha256 of ${image.url} is ${got}, want ${image.sha256.toLowerCase()}; ${disk.device} wiped`,
    );
  }
  if (configDrive !== undefined) {
    const target = {
      disk: disk.device,
      handle: disk.handle,
      diskBytes: disk.capacity,
      blockSize: configDrive.blockSize,
      head: disk.head,
    };
    try {
      disk.replaceHead(await writeConfigDrive(target, configDrive.contents));
    } catch (error) {
      throw new InstallationError('config-drive', `config drive: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }
  await disk.commit();
  return { bytes, downloaded, format };
}

/** A stream writing what it is given to the disk from its first byte on, in order. */
class SequentialWriter extends Writable {
  /** Bytes written so far (the image's size, at its end). */
  position = 0;

  constructor(
    private readonly disk: TargetDisk,
    private readonly url: string,
    /** How the image was stored: a decompressed one must not be a qcow2. */
    private readonly format: ImageFormat,
  ) {
    super({ highWaterMark: 4 << 20 });
  }

  // The chunks waiting while a write is under way arrive together and go to the disk in one write.
  override _writev(chunks: { chunk: Buffer }[], done: (error?: Error | null) => void): void {
    const bytes =
      chunks.length === 1 ? (chunks[0] as { chunk: Buffer }).chunk : Buffer.concat(chunks.map((c) => c.chunk));
    if (this.position === 0 && this.format !== 'raw' && formatOf(bytes) === 'qcow2') {
      done(
        new InstallationError(
          'format',
          `${this.url} is a qcow2 image compressed with ${this.format}: serve the qcow2 itself, which the agent reads as it is`,
        ),
      );
      return;
    }
    const at = this.position;
    this.position += bytes.length;
    this.disk.write(at, bytes).then(() => done(), done);
  }
}

/** The first `count` bytes of `stream` (fewer if it ends first), put back to be read again. */
async function firstBytes(stream: Readable, count: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let length = 0;
  while (length < count) {
    const chunk = stream.read() as Buffer | null;
    if (chunk !== null) {
      chunks.push(chunk);
      length += chunk.length;
      continue;
    }
    if (stream.readableEnded) break;
    if (stream.destroyed) throw stream.errored ?? new Error('the download ended before its first bytes');
    await new Promise<void>((resolve, reject) => {
      const settle = (error?: Error) => {
        stream.off('readable', settle).off('end', settle).off('error', settle).off('close', settle);
        if (error instanceof Error) reject(error);
        else resolve();
      };
      stream.on('readable', settle).on('end', settle).on('error', settle).on('close', settle);
    });
  }
  const first = Buffer.concat(chunks);
  if (first.length > 0) stream.unshift(first);
  return first.subarray(0, count);
}

/** Bytes `start` to `end` (exclusive) of the image, by a range request. */
async function readRange(
  url: string,
  start: number,
  end: number,
  fetch: { ca: string | undefined; signal: AbortSignal; idleTimeoutMs: number | undefined },
): Promise<Buffer> {
  const response: IncomingMessage = await download(url, { ...fetch, range: { start, end } });
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  const bytes = Buffer.concat(chunks);
  if (bytes.length !== end - start) {
    throw new InstallationError(
      'format',
      `${url}: bytes ${start} to ${end} read as ${bytes.length} bytes (the file is shorter than its qcow2 header says)`,
    );
  }
  return bytes;
}
