import { createHash } from 'node:crypto';
import { Writable } from 'node:stream';
import { constants, inflateRawSync } from 'node:zlib';
import { InstallationError } from './errors.js';
import type { TargetDisk } from './target-disk.js';

/**
 * qcow2 as a stream, without scratch space: the image's metadata (header,
 * L1 table, L2 tables) is read first with HTTP range requests, giving where
 * each of its clusters lies in the file; then the file is downloaded once,
 * front to back (its sha256 checked as for any image), and each cluster is
 * written to its place on the disk as it passes, deflate-compressed ones
 * inflated. The metadata bytes passing in that download must equal those
 * read before, so what was mapped is what was checked. The memory this
 * takes is 16 bytes per allocated cluster and 1 per cluster of the disk
 * (about 40 while the L2 tables are read): a 20 GiB image of 64 KiB
 * clusters, wholly allocated, under 13 MiB; and one L2 table, or a cluster
 * or two of the download, at a time.
 * What reads as zeros (unallocated clusters, zero clusters) is written as
 * zeros, so the disk ends as `qemu-img convert -O raw` would leave it.
 *
 * Refused, naming the image: a backing file, encryption, an external data
 * file, extended L2 entries (subclusters), a compression other than
 * deflate, an image marked corrupt, and any incompatible feature this
 * reader does not know.
 */

/** What range reads of the image's bytes give: `end` exclusive. */
export type ReadRange = (start: number, end: number) => Promise<Buffer>;

/** The parts of a qcow2 header this reader uses. */
export interface Qcow2Header {
  readonly version: 2 | 3;
  readonly clusterBits: number;
  readonly clusterSize: number;
  /** The disk's size as the image describes it. */
  readonly virtualSize: number;
  readonly l1Size: number;
  readonly l1Offset: number;
}

/** The header's bytes read first: version 3's fixed part and the compression type. */
export const QCOW2_HEADER_BYTES = 112;

/** Incompatible feature bits: dirty (refcounts only, harmless to a reader), corrupt, external data file, compression type, extended L2. */
const DIRTY = 1n << 0n;

/** Offsets in L1 and standard L2 entries: bits 9 to 55. */
const OFFSET_MASK = 0x00fffffffffffe00n;
const COMPRESSED = 1n << 62n;
const READS_AS_ZERO = 1n;

/**
 * The header of a qcow2 image, checked.
 *
 * @throws {@link InstallationError} (`format`) for a feature this reader refuses
 */
export function parseQcow2Header(bytes: Buffer, url: string): Qcow2Header {
  const refuse = (why: string) => new InstallationError('format', `qcow2 image ${url}: ${why}`);
  if (bytes.length < 72 || bytes.readUInt32BE(0) !== 0x514649fb) throw refuse('no qcow2 header');
  const version = bytes.readUInt32BE(4);
  if (version !== 2 && version !== 3) throw refuse(`version ${version}; this agent reads versions 2 and 3`);
  if (bytes.readBigUInt64BE(8) !== 0n) throw refuse('it has a backing file: serve the image flattened');
  const clusterBits = bytes.readUInt32BE(20);
  if (clusterBits < 9 || clusterBits > 21) throw refuse(`cluster_bits ${clusterBits} is outside 9 to 21`);
  if (bytes.readUInt32BE(32) !== 0) throw refuse('it is encrypted');
  if (version === 3) {
    if (bytes.length < 104) throw refuse('its version 3 header is cut short');
    const incompatible = bytes.readBigUInt64BE(72);
    const unknown = incompatible & ~DIRTY;
    if (unknown & 2n) throw refuse('it is marked corrupt');
    if (unknown & 4n) throw refuse('its data is in an external file');
    if (unknown & 8n) throw refuse(`its clusters are compressed with a method other than deflate`);
    if (unknown & 16n) throw refuse('it has extended L2 entries (subclusters)');
    if (unknown !== 0n) throw refuse(`incompatible features 0x${incompatible.toString(16)} unknown to this agent`);
    const headerLength = bytes.readUInt32BE(100);
    if (headerLength > 104 && bytes.length > 104 && bytes[104] !== 0) {
      throw refuse(`compression type ${bytes[104]}; this agent inflates deflate (0) only`);
    }
  }
  const virtualSize = Number(bytes.readBigUInt64BE(24));
  const l1Size = bytes.readUInt32BE(36);
  const clusterSize = 2 ** clusterBits;
  const l2Entries = clusterSize / 8;
  if (l1Size < Math.ceil(virtualSize / clusterSize / l2Entries)) {
    throw refuse(`its L1 table of ${l1Size} entries cannot map ${virtualSize} bytes`);
  }
  return {
    version,
    clusterBits,
    clusterSize,
    virtualSize,
    l1Size,
    l1Offset: Number(bytes.readBigUInt64BE(40)),
  };
}

/** Where each cluster of the image lies in its file, in the order of the file; and the metadata to check again. */
export interface Qcow2Map {
  readonly header: Qcow2Header;
  /** Each allocated cluster: its index in the disk, where its bytes start in the file, how many (compressed: fewer than a cluster). */
  readonly clusters: {
    readonly guest: Uint32Array;
    readonly host: Float64Array;
    /** 0: a whole cluster, stored as it is; else the bytes of its deflate stream (at most). */
    readonly compressedBytes: Uint32Array;
  };
  /** The metadata read: each range's sha256, to compare with the same bytes in the download. */
  readonly metadata: readonly { readonly start: number; readonly end: number; readonly sha256: string }[];
}

/**
 * Reads a qcow2 image's header, L1 table and L2 tables through `read` and
 * maps its allocated clusters, sorted by their place in the file.
 *
 * @throws {@link InstallationError} (`format`) for an image this reader refuses or cannot map
 */
export async function mapQcow2(read: ReadRange, url: string): Promise<Qcow2Map> {
  const headerBytes = await read(0, QCOW2_HEADER_BYTES);
  const header = parseQcow2Header(headerBytes, url);
  const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');
  const metadata = [{ start: 0, end: QCOW2_HEADER_BYTES, sha256: sha(headerBytes) }];
  const { clusterSize, clusterBits, virtualSize } = header;
  const clusterCount = Math.ceil(virtualSize / clusterSize);
  const l2Entries = clusterSize / 8;
  const l1Used = Math.ceil(clusterCount / l2Entries);
  const l1 = await read(header.l1Offset, header.l1Offset + 8 * l1Used);
  metadata.push({ start: header.l1Offset, end: header.l1Offset + l1.length, sha256: sha(l1) });
  const guest: number[] = [];
  const host: number[] = [];
  const compressedBytes: number[] = [];
  // Compressed entries: the offset in the low bits, then the count of further 512-byte sectors.
  const offsetBits = BigInt(62 - (clusterBits - 8));
  const offsetMask = (1n << offsetBits) - 1n;
  const sectorsMask = (1n << BigInt(clusterBits - 8)) - 1n;
  for (let i = 0; i < l1Used; i++) {
    const l2Offset = Number(l1.readBigUInt64BE(8 * i) & OFFSET_MASK);
    if (l2Offset === 0) continue;
    const l2 = await read(l2Offset, l2Offset + clusterSize);
    metadata.push({ start: l2Offset, end: l2Offset + clusterSize, sha256: sha(l2) });
    for (let j = 0; j < l2Entries; j++) {
      const cluster = i * l2Entries + j;
      if (cluster >= clusterCount) break;
      const entry = l2.readBigUInt64BE(8 * j);
      if (entry & COMPRESSED) {
        const offset = Number(entry & offsetMask);
        const sectors = Number((entry >> offsetBits) & sectorsMask);
        guest.push(cluster);
        host.push(offset);
        compressedBytes.push((sectors + 1) * 512 - (offset % 512));
      } else if (!(entry & READS_AS_ZERO)) {
        const offset = Number(entry & OFFSET_MASK);
        if (offset === 0) continue;
        if (offset % clusterSize !== 0) {
          throw new InstallationError(
            'format',
            `qcow2 image ${url}: cluster ${cluster} at ${offset}, not cluster-aligned`,
          );
        }
        guest.push(cluster);
        host.push(offset);
        compressedBytes.push(0);
      }
    }
  }
  const order = Uint32Array.from(host.keys()).sort((a, b) => (host[a] as number) - (host[b] as number));
  return {
    header,
    clusters: {
      guest: Uint32Array.from(order, (k) => guest[k] as number),
      host: Float64Array.from(order, (k) => host[k] as number),
      compressedBytes: Uint32Array.from(order, (k) => compressedBytes[k] as number),
    },
    metadata,
  };
}

/** One span of the file to act on as the download passes it: metadata to compare, or a cluster to write. */
type Span =
  | { readonly kind: 'metadata'; readonly start: number; readonly end: number; readonly sha256: string }
  | {
      readonly kind: 'cluster';
      readonly start: number;
      readonly end: number;
      /** The cluster's index in the disk. */
      readonly index: number;
      readonly compressed: boolean;
    };

/**
 * A stream taking the qcow2 file front to back and writing its clusters to
 * `disk` as they pass; at its end, it writes zeros where the image has no
 * data. It keeps no more of the file than the longest span under way.
 *
 * @throws {@link InstallationError} (`too-large`) when the image's disk is larger than `disk`
 */
export function qcow2Writer(map: Qcow2Map, disk: TargetDisk, url: string): Writable {
  const { virtualSize } = map.header;
  if (virtualSize > disk.capacity) {
    throw new InstallationError(
      'too-large',
      `root device ${disk.device} holds ${disk.capacity} bytes; the image ${url} is a disk of ${virtualSize}`,
    );
  }
  return new Qcow2Writer(map, disk, url);
}

class Qcow2Writer extends Writable {
  readonly #disk: TargetDisk;
  readonly #url: string;
  readonly #clusterSize: number;
  readonly #virtualSize: number;
  /** Every span, in the order of the file. */
  readonly #spans: Span[];
  /** The next span to act on. */
  #next = 0;
  /** Whether each cluster of the disk was written from the image. */
  readonly #written: Uint8Array;
  /** The downloaded bytes from `#windowStart` on, not yet past every span that needs them. */
  #window: Buffer[] = [];
  #windowStart = 0;
  #windowEnd = 0;

  constructor(map: Qcow2Map, disk: TargetDisk, url: string) {
    super({ highWaterMark: 4 << 20 });
    this.#disk = disk;
    this.#url = url;
    this.#clusterSize = map.header.clusterSize;
    this.#virtualSize = map.header.virtualSize;
    this.#written = new Uint8Array(Math.ceil(this.#virtualSize / this.#clusterSize));
    const spans: Span[] = map.metadata.map((m) => ({ kind: 'metadata', ...m }));
    const { guest, host, compressedBytes } = map.clusters;
    for (let k = 0; k < guest.length; k++) {
      const compressed = (compressedBytes[k] as number) > 0;
      const start = host[k] as number;
      const end = start + (compressed ? (compressedBytes[k] as number) : this.#clusterSize);
      spans.push({ kind: 'cluster', start, end, index: guest[k] as number, compressed });
    }
    this.#spans = spans.sort((a, b) => a.start - b.start);
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    if (this.#window.length === 0) this.#windowStart = this.#windowEnd;
    this.#window.push(chunk);
    this.#windowEnd += chunk.length;
    this.#drain(false).then(() => done(), done);
  }

  override _final(done: (error?: Error | null) => void): void {
    this.#drain(true)
      .then(() => this.#writeZeros())
      .then(() => done(), done);
  }

  /** Bytes `start` to `end` of the file, as far as the window holds them. */
  #take(start: number, end: number): Buffer {
    const whole = this.#window.length === 1 ? (this.#window[0] as Buffer) : Buffer.concat(this.#window);
    this.#window = [whole];
    return whole.subarray(start - this.#windowStart, Math.min(end, this.#windowEnd) - this.#windowStart);
  }

  /** Acts on every span the window holds whole (every one left, at the end), then drops what none needs. */
  async #drain(ended: boolean): Promise<void> {
    while (this.#next < this.#spans.length) {
      const span = this.#spans[this.#next] as Span;
      if (span.end > this.#windowEnd && !ended) break;
      // A compressed cluster's last sector may lie past the file's end; nothing else may.
      if (
        span.start >= this.#windowEnd ||
        (span.end > this.#windowEnd && !(span.kind === 'cluster' && span.compressed))
      ) {
        throw new InstallationError(
          'format',
          `qcow2 image ${this.#url}: it ends at ${this.#windowEnd}, before its ${span.kind} at ${span.start} to ${span.end}`,
        );
      }
      await this.#act(span, this.#take(span.start, span.end));
      this.#next++;
    }
    const following = this.#spans[this.#next];
    const keepFrom = following ? Math.min(following.start, this.#windowEnd) : this.#windowEnd;
    if (keepFrom > this.#windowStart) {
      const kept = this.#take(keepFrom, this.#windowEnd);
      this.#window = kept.length > 0 ? [Buffer.from(kept)] : [];
      this.#windowStart = keepFrom;
    }
  }

  async #act(span: Span, bytes: Buffer): Promise<void> {
    const url = this.#url;
    if (span.kind === 'metadata') {
      if (createHash('sha256').update(bytes).digest('hex') !== span.sha256) {
        throw new InstallationError(
          'format',
          `qcow2 image ${url}: its metadata at ${span.start} changed between the range reads and the download`,
        );
      }
      return;
    }
    const at = span.index * this.#clusterSize;
    const length = Math.min(this.#clusterSize, this.#virtualSize - at);
    let data = bytes;
    if (span.compressed) {
      try {
        data = inflateRawSync(bytes, { finishFlush: constants.Z_SYNC_FLUSH, maxOutputLength: this.#clusterSize });
      } catch (error) {
        throw new InstallationError(
          'format',
          `qcow2 image ${url}: compressed cluster ${span.index} at ${span.start} does not inflate: ${(error as Error).message}`,
          { cause: error },
        );
      }
    }
    if (data.length < length) {
      throw new InstallationError(
        'format',
        `qcow2 image ${url}: cluster ${span.index} at ${span.start} holds ${data.length} bytes, not ${length}`,
      );
    }
    await this.#disk.write(at, data.subarray(0, length));
    this.#written[span.index] = 1;
  }

  /** Writes zeros where the image has no data, in runs of up to 4 MiB; the first MiB is zeros in memory already. */
  async #writeZeros(): Promise<void> {
    this.#disk.extendHead(this.#virtualSize);
    const zeros = Buffer.alloc(Math.max(this.#clusterSize, 4 << 20));
    const count = this.#written.length;
    for (let cluster = 0; cluster < count; ) {
      if (this.#written[cluster]) {
        cluster++;
        continue;
      }
      const from = cluster * this.#clusterSize;
      let to = from;
      while (cluster < count && !this.#written[cluster] && to - from < zeros.length) {
        cluster++;
        to = Math.min(cluster * this.#clusterSize, this.#virtualSize);
      }
      await this.#disk.write(from, zeros.subarray(0, to - from));
    }
  }
}
