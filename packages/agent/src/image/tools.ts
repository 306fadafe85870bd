import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { AgentImageError } from './errors.js';

/** The Debian package of each program the build runs, named when it is missing. */
const PACKAGES: Record<string, string> = {
  xorriso: 'xorriso',
  'grub-mkimage': 'grub-common',
  'mkfs.fat': 'dosfstools',
  mmd: 'mtools',
  mcopy: 'mtools',
};

/** Runs a build tool; its failure is an {@link AgentImageError} naming the tool (and its package when missing). */
export async function tool(program: string, args: readonly string[]): Promise<string> {
  try {
    // mtools checks a disk's geometry against its size; a file system image has none to check.
    const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
    return (await promisify(execFile)(program, [...args], { env, maxBuffer: 16 * 2 ** 20 })).stdout;
  } catch (error) {
    const e = error as NodeJS.ErrnoException & { stderr?: string };
    if (e.code === 'ENOENT') {
      throw new AgentImageError(`${program} not found: install Debian's ${PACKAGES[program] ?? program} package`);
    }
    throw new AgentImageError(`${program} ${args.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
  }
}
