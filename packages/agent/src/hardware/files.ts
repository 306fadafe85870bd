import { lstat, readdir, readFile, readlink } from 'node:fs/promises';
import path from 'node:path';

/**
 * Reads of sysfs and procfs under a root directory (`/` on a machine, a
 * recorded tree in tests). A file that is missing, or that the kernel
 * refuses to read (sysfs answers EINVAL for a link's speed while it is
 * down), reads as undefined: every caller treats it as "not reported".
 */

/** The trimmed text of `root/relative`, or undefined when it cannot be read. */
export async function readText(root: string, relative: string): Promise<string | undefined> {
  try {
    return (await readFile(path.join(root, relative), 'utf8')).trim();
  } catch {
    return undefined;
  }
}

/** The bytes of `root/relative`, or undefined when it cannot be read. */
export async function readBytes(root: string, relative: string): Promise<Uint8Array | undefined> {
  try {
    return await readFile(path.join(root, relative));
  } catch {
    return undefined;
  }
}

/** The decimal integer in `root/relative`, or undefined when it is not one. */
export async function readInteger(root: string, relative: string): Promise<number | undefined> {
  const text = await readText(root, relative);
  if (text === undefined || !/^-?\d+$/.test(text)) return undefined;
  return Number(text);
}

/** The names in directory `root/relative`, sorted; none when it cannot be read. */
export async function listNames(root: string, relative: string): Promise<string[]> {
  try {
    return (await readdir(path.join(root, relative))).sort();
  } catch {
    return [];
  }
}

/** The last component of the target of link `root/relative` (a driver's name), or undefined. */
export async function linkName(root: string, relative: string): Promise<string | undefined> {
  try {
    return path.basename(await readlink(path.join(root, relative)));
  } catch {
    return undefined;
  }
}

/** Whether `root/relative` exists (a link counts, whether or not its target does). */
export async function exists(root: string, relative: string): Promise<boolean> {
  try {
    await lstat(path.join(root, relative));
    return true;
  } catch {
    return false;
  }
}
