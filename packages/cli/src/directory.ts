import { constants } from 'node:fs';
import { access, mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { UsageError } from './settings.js';

/**
 * Makes sure `dir` is a directory this process can write, creating it and
 * its missing parents, or says why not as bad input of `flag`.
 *
 * One level at a time rather than `mkdir({ recursive: true })`: Node's
 * recursive mkdir never returns where the file system refuses a directory
 * without saying why, as /proc does (ENOENT for a parent that exists).
 */
export async function ensureDirectory(flag: string, dir: string, mode?: number): Promise<void> {
  const target = path.resolve(dir);
  const missing: string[] = [];
  for (let current = target; ; current = path.dirname(current)) {
    const found = await kindOf(flag, dir, current);
    if (found === 'directory') break;
    if (found === 'other') {
      throw new UsageError(
        flag,
        `cannot use ${JSON.stringify(dir)}: ${current === target ? 'it' : JSON.stringify(current)} is not a directory`,
      );
    }
    missing.unshift(current);
    if (path.dirname(current) === current) break;
  }
  for (const current of missing) {
    try {
      await mkdir(current, mode === undefined ? {} : { mode });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') continue; // another process was quicker
      throw new UsageError(flag, `cannot create ${JSON.stringify(dir)}: ${reason(error, current, dir)}`);
    }
  }
  try {
    await access(target, constants.W_OK | constants.X_OK);
  } catch (error) {
    throw new UsageError(flag, `cannot write in ${JSON.stringify(dir)}: ${reason(error, target, dir)}`);
  }
}

async function kindOf(flag: string, dir: string, file: string): Promise<'directory' | 'other' | 'missing'> {
  try {
    return (await stat(file)).isDirectory() ? 'directory' : 'other';
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // ENOTDIR: a level above is a file, which the walk up finds and names.
    if (code === 'ENOENT' || code === 'ENOTDIR') return 'missing';
    throw new UsageError(flag, `cannot use ${JSON.stringify(dir)}: ${reason(error, file, dir)}`);
  }
}

const REASONS: Record<string, string> = {
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EROFS: 'read-only file system',
  ENOSPC: 'no space left on the device',
  ENOTDIR: 'a part of the path is not a directory',
  // mkdir in a directory that exists: the file system refuses new entries (e.g. /proc).
  ENOENT: 'the file system does not allow a directory there',
};

/** `EACCES (permission denied)`, naming the level of the path that failed when it is not the one asked for. */
function reason(error: unknown, file: string, dir: string): string {
  const code = (error as NodeJS.ErrnoException).code ?? 'error';
  const text = REASONS[code] ?? (error as Error).message;
  return `${file === path.resolve(dir) ? '' : `at ${JSON.stringify(file)}, `}${code} (${text})`;
}
