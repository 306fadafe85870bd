// A file answered over HTTP/1.1 as BMCs fetch ISOs: in pieces (RFC 9110 §14, range requests).
import type { FileHandle } from 'node:fs/promises';
import { open } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';

/** Bytes read from the file at a time: BMCs ask for up to a few MiB a request. */
const READ_CHUNK_BYTES = 256 * 1024;

/** What was sent, for the caller's log line. */
export interface FileSent {
  readonly status: 200 | 206 | 404 | 416;
  /** `first-last/size` of a 206, else undefined. */
  readonly range?: string;
  /** The client went away before the last byte. */
  readonly brokenOff: boolean;
}

/** A range of bytes, both ends included. */
interface ByteRange {
  readonly first: number;
  readonly last: number;
}

/**
 * The answer to a request's `Range` for a file of `size` bytes: a single range,
 * `'whole'` (no range, or one this server does not serve in pieces) or
 * `'unsatisfiable'` (416). A multi-range request is answered with the whole
 * file: RFC 9110 lets a server ignore `Range`, a multipart body is what no
 * BMC or iPXE asks for, and its sum is never smaller than the file.
 */
function requestedRange(header: string | undefined, size: number): ByteRange | 'whole' | 'unsatisfiable' {
  if (header === undefined) return 'whole';
  const match = /^bytes=\s*(\d{0,15})-(\d{0,15})\s*$/.exec(header);
  // Another unit, several ranges or bad syntax: RFC 9110 §14.2 lets the server ignore the field.
  if (!match) return 'whole';
  const [, firstText = '', lastText = ''] = match;
  if (firstText === '') {
    if (lastText === '') return 'whole';
    const suffix = Number(lastText);
    if (suffix === 0 || size === 0) return 'unsatisfiable';
    return { first: Math.max(0, size - suffix), last: size - 1 };
  }
  const first = Number(firstText);
  const last = lastText === '' ? Number.POSITIVE_INFINITY : Number(lastText);
  // A last before the first is no range at all (ignored); a first past the end is one this file cannot satisfy.
  if (last < first) return 'whole';
  if (first >= size) return 'unsatisfiable';
  return { first, last: Math.min(last, size - 1) };
}

/** A strong validator: the file's inode, size and modification time (nanoseconds). */
function entityTag(stats: { ino: bigint; size: bigint; mtimeNs: bigint }): string {
  return `"${stats.ino.toString(36)}-${stats.size.toString(36)}-${stats.mtimeNs.toString(36)}"`;
}

/**
 * Answers a GET or HEAD with the file at `path`: `200` with the whole file, or
 * `206` with one range of it (`Content-Range`), `416` for a range past its end;
 * `Accept-Ranges`, `ETag` (an `If-Range` with another tag, or a date, gets the
 * whole file), `Content-Length`. The file is streamed from one open handle, so
 * a file replaced meanwhile is never answered half old, half new; a file that
 * is gone is a `404`.
 */
export async function sendFile(
  request: IncomingMessage,
  response: ServerResponse,
  path: string,
  headers: { readonly contentType: string; readonly cacheControl: string },
): Promise<FileSent> {
  let handle: FileHandle;
  try {
    handle = await open(path, 'r');
  } catch {
    response.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
    return { status: 404, brokenOff: false };
  }
  let streaming = false;
  try {
    const stats = await handle.stat({ bigint: true });
    const size = Number(stats.size);
    const etag = entityTag(stats);
    const common = {
      'accept-ranges': 'bytes',
      etag,
      'content-type': headers.contentType,
      'cache-control': headers.cacheControl,
    };
    const ifRange = request.headers['if-range'];
    const rangeHeader =
      request.method === 'GET' && (ifRange === undefined || ifRange === etag) ? request.headers.range : undefined;
    const range = requestedRange(rangeHeader, size);
    if (range === 'unsatisfiable') {
      response.writeHead(416, { ...common, 'content-range': `bytes */${size}`, 'content-length': 0 }).end();
      return { status: 416, brokenOff: false };
    }
    const whole = range === 'whole';
    const { first, last } = whole ? { first: 0, last: size - 1 } : range;
    const length = last - first + 1;
    response.writeHead(
      whole ? 200 : 206,
      whole
        ? { ...common, 'content-length': size }
        : { ...common, 'content-length': length, 'content-range': `bytes ${first}-${last}/${size}` },
    );
    const sent: FileSent = whole
      ? { status: 200, brokenOff: false }
      : { status: 206, range: `${first}-${last}/${size}`, brokenOff: false };
    if (request.method === 'HEAD' || length === 0) {
      response.end();
      return sent;
    }
    streaming = true;
    try {
      // The stream closes the handle when it ends or is destroyed.
      await pipeline(handle.createReadStream({ start: first, end: last, highWaterMark: READ_CHUNK_BYTES }), response);
      return sent;
    } catch {
      return { ...sent, brokenOff: true };
    }
  } finally {
    if (!streaming) await handle.close();
  }
}
