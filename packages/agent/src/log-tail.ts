import { open } from 'node:fs/promises';

/** The most of its log the agent sends in one heartbeat, in bytes of UTF-8 (the BMDB keeps no more). */
export const AGENT_LOG_MAX_BYTES = 64 * 1024;

/** Which version of the log file a tail was read from: unchanged size and time, unchanged log. */
export interface LogVersion {
  readonly size: number;
  readonly modifiedMs: number;
}

/** The last bytes of a log file, as text, with the version they were read from. */
export interface LogTail {
  readonly text: string;
  readonly version: LogVersion;
}

/**
 * Reads the last at most {@link AGENT_LOG_MAX_BYTES} bytes of `file` as
 * UTF-8, starting at a whole line where the file was cut (or, for a line
 * longer than the bound, at a whole character); NULs (which the BMDB's text
 * cannot hold) are dropped. `undefined` when the file does not exist yet, or
 * when it is still the version `unless`, so an unchanged log is not read.
 */
export async function readLogTail(file: string, unless?: LogVersion): Promise<LogTail | undefined> {
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    handle = await open(file, 'r');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  try {
    const stat = await handle.stat();
    const version = { size: stat.size, modifiedMs: stat.mtimeMs };
    if (unless && unless.size === version.size && unless.modifiedMs === version.modifiedMs) return undefined;
    const length = Math.min(stat.size, AGENT_LOG_MAX_BYTES);
    const bytes = Buffer.alloc(length);
    const { bytesRead } = await handle.read(bytes, 0, length, stat.size - length);
    let chunk = bytes.subarray(0, bytesRead);
    if (stat.size > length) chunk = chunk.subarray(cutAt(chunk));
    const text = new TextDecoder().decode(chunk).replaceAll('\0', '');
    // A byte that is not UTF-8 decodes to U+FFFD, three bytes: cut again, now from valid UTF-8.
    const encoded = Buffer.from(text, 'utf8');
    if (encoded.length <= AGENT_LOG_MAX_BYTES) return { text, version };
    const over = encoded.subarray(encoded.length - AGENT_LOG_MAX_BYTES);
    return { text: over.subarray(cutAt(over)).toString('utf8'), version };
  } finally {
    await handle.close();
  }
}

/** Where a tail cut from the middle of a file starts: after its first newline, else at its first whole character. */
function cutAt(chunk: Buffer): number {
  const newline = chunk.indexOf(0x0a);
  if (newline >= 0 && newline < chunk.length - 1) return newline + 1;
  let start = 0;
  // UTF-8 continuation bytes are 10xxxxxx.
  while (start < chunk.length && ((chunk[start] ?? 0) & 0xc0) === 0x80) start++;
  return start;
}
