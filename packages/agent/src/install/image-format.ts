import { spawn } from 'node:child_process';
import { Duplex, PassThrough } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { InstallationError } from './errors.js';

/** How an image is stored as downloaded: a raw disk, one compressed whole, or a qcow2 (QEMU's copy-on-write format). */
export type ImageFormat = 'raw' | 'gzip' | 'xz' | 'zstd' | 'qcow2';

/** The first bytes of each format but raw, which has none. */
const MAGIC: readonly (readonly [Exclude<ImageFormat, 'raw'>, Buffer])[] = [
  ['gzip', Buffer.from([0x1f, 0x8b])],
  ['xz', Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00])],
  ['zstd', Buffer.from([0x28, 0xb5, 0x2f, 0xfd])],
  ['qcow2', Buffer.from([0x51, 0x46, 0x49, 0xfb])],
];

/** The most bytes {@link formatOf} looks at. */
export const MAGIC_BYTES = 6;

/**
 * The format an image's first bytes say. A disk's first bytes are boot code,
 * a protective MBR or zeros, never one of these signatures, so anything else
 * is raw.
 */
export function formatOf(first: Uint8Array): ImageFormat {
  const bytes = Buffer.from(first.buffer, first.byteOffset, first.byteLength);
  return MAGIC.find(([, magic]) => bytes.subarray(0, magic.length).equals(magic))?.[0] ?? 'raw';
}

/** The most memory `xz -dc` may take; an image needing more fails, saying so. */
export const XZ_MEMORY_LIMIT = '256MiB';

/**
 * A stream decompressing `format`: gzip with Node's zlib; xz and zstd with
 * the programs the agent image carries (`xz -dc` of Debian's xz-utils,
 * `zstd -dc` of Debian's zstd), since Node 20's zlib has neither.
 */
export function decompressor(format: 'gzip' | 'xz' | 'zstd', url: string): Duplex {
  if (format === 'gzip') return createGunzip();
  // xz's memory is bounded as zstd's is by default (128 MiB): xz -9 needs 65 MiB.
  if (format === 'xz')
    return new ProcessDecompressor('xz', ['-dc', '-T1', `--memlimit-decompress=${XZ_MEMORY_LIMIT}`], url);
  return new ProcessDecompressor('zstd', ['-dc'], url);
}

/**
 * A decompressing program as a stream: what is written goes to its standard
 * input, its standard output is read. Its output ends only once it exited 0;
 * another exit is an {@link InstallationError} (`format`) with what it said.
 */
class ProcessDecompressor extends Duplex {
  readonly #output = new PassThrough({ highWaterMark: 1 << 20 });
  readonly #child;

  constructor(program: 'xz' | 'zstd', args: readonly string[], url: string) {
    super({ readableHighWaterMark: 1 << 20 });
    const child = spawn(program, [...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#child = child;
    let said = '';
    child.stderr.on('data', (chunk: Buffer) => {
      said = (said + chunk.toString('utf8')).slice(-2000);
    });
    // A program that died early closes its input: its exit, not the EPIPE, says why.
    child.stdin.on('error', () => {});
    child.stdout.pipe(this.#output, { end: false });
    child.on('error', (error: NodeJS.ErrnoException) => {
      const why =
        error.code === 'ENOENT'
          ? `${program} not found (the agent image carries Debian's ${program === 'xz' ? 'xz-utils' : 'zstd'})`
          : error.message;
      this.destroy(new InstallationError('format', `decompressing ${url} with ${program}: ${why}`, { cause: error }));
    });
    child.on('close', (code, signal) => {
      if (code === 0) this.#output.end();
      else if (!this.destroyed) {
        this.destroy(
          new InstallationError(
            'format',
            `decompressing ${url} with ${program} failed (${code === null ? signal : `exit ${code}`}): ${said.trim()}`,
          ),
        );
      }
    });
    this.#output.on('data', (chunk: Buffer) => {
      if (!this.push(chunk)) this.#output.pause();
    });
    this.#output.on('end', () => this.push(null));
  }

  override _read(): void {
    this.#output.resume();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    if (this.#child.stdin.write(chunk)) done();
    else this.#child.stdin.once('drain', () => done());
  }

  override _final(done: (error?: Error | null) => void): void {
    this.#child.stdin.end(() => done());
  }

  override _destroy(error: Error | null, done: (error?: Error | null) => void): void {
    if (this.#child.exitCode === null) this.#child.kill('SIGKILL');
    done(error);
  }
}
