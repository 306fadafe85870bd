import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { type CpioEntry, cpioArchive, moduleOrder, sharedLibraries } from '@bmaas/agent';
import { LabSetupError } from './errors.js';
import { GUEST_MODULES, guestFiles } from './guest-files.js';
import type { GuestKernel } from './kernel.js';
import { log } from './log.js';

const run = promisify(execFile);

/** Bump when the layout changes in a way the inputs' stamps do not show. */
const FORMAT = 1;

/** Programs copied in, with the Debian package each comes from (named when missing). */
const PROGRAMS = [
  { path: '/bin/busybox', pkg: 'busybox-static' },
  { path: '/usr/sbin/sshd', pkg: 'openssh-server' },
  { path: '/usr/lib/openssh/sftp-server', pkg: 'openssh-sftp-server' },
];

/** A built initramfs and what it took. */
export interface Initramfs {
  readonly path: string;
  /** Found in the cache, not built. */
  readonly cached: boolean;
  readonly bytes: number;
}

/**
 * The guest's initramfs, an uncompressed cpio (nothing to decompress under
 * software emulation): busybox (as init, shell and tools), OpenSSH's sshd and
 * sftp-server with their libraries, the C++ runtime the shared node binary
 * needs, the kernel modules for virtio networking, disks and 9p, and the
 * lab's own init files. Built from the files on this machine, and cached
 * under `cacheDir` by a hash of every input's path, size and time, so a
 * second start reads it back.
 *
 * @param nodeBinary - the node the guest runs (shared over 9p); only its libraries go in
 */
export async function buildInitramfs(cacheDir: string, kernel: GuestKernel, nodeBinary: string): Promise<Initramfs> {
  for (const program of PROGRAMS) {
    await stat(program.path).catch(() => {
      throw new LabSetupError(
        `${program.path} is missing: install Debian's ${program.pkg} package (apt-get install ${program.pkg})`,
      );
    });
  }
  const modules = await moduleOrder(kernel, GUEST_MODULES);
  const libraries = await sharedLibraries([...PROGRAMS.map((p) => p.path), nodeBinary]);
  const applets = (await run('/bin/busybox', ['--list'])).stdout.split('\n').filter((a) => a !== '' && a !== 'busybox');
  const files = guestFiles(modules);
  const sources = [...PROGRAMS.map((p) => p.path), ...libraries, ...modules.map((m) => path.join(kernel.modules, m))];

  const hash = createHash('sha256').update(`format ${FORMAT}\n`);
  for (const source of sources) {
    const s = await stat(source);
    hash.update(`${source} ${s.size} ${s.mtimeMs}\n`);
  }
  for (const file of files) hash.update(`${file.path} ${file.mode} ${file.text}\n`);
  hash.update(applets.join(' '));
  const target = path.join(cacheDir, `initramfs-${kernel.release}-${hash.digest('hex').slice(0, 16)}.cpio`);
  const existing = await stat(target).catch(() => undefined);
  if (existing) {
    log('initramfs %s from the cache', target);
    return { path: target, cached: true, bytes: existing.size };
  }

  const entries: CpioEntry[] = [];
  const dirs = new Set<string>();
  const dir = (p: string) => {
    const parts = p.split('/').filter((s) => s !== '');
    for (let i = 1; i <= parts.length; i++) {
      const d = `/${parts.slice(0, i).join('/')}`;
      if (dirs.has(d)) continue;
      dirs.add(d);
      entries.push({ kind: 'dir', path: d, mode: d === '/root' ? 0o700 : 0o755 });
    }
  };
  for (const d of [
    '/bin',
    '/sbin',
    '/usr/bin',
    '/usr/sbin',
    '/etc',
    '/proc',
    '/sys',
    '/dev',
    '/run',
    '/tmp',
    '/root',
    '/mnt',
    '/opt',
    '/var/empty',
    '/lib64',
  ]) {
    dir(d);
  }
  const copy = async (source: string, destination = source) => {
    dir(path.dirname(destination));
    const s = await stat(source);
    entries.push({ kind: 'file', path: destination, data: await readFile(source), mode: s.mode & 0o7777 });
  };
  for (const program of PROGRAMS) await copy(program.path);
  for (const library of libraries) await copy(library);
  for (const module of modules) await copy(path.join(kernel.modules, module), `/lib/modules/${module}`);
  for (const applet of applets) entries.push({ kind: 'symlink', path: `/bin/${applet}`, target: '/bin/busybox' });
  entries.push({ kind: 'symlink', path: '/init', target: '/bin/busybox' });
  for (const file of files) {
    dir(path.dirname(file.path));
    entries.push({ kind: 'file', path: file.path, data: Buffer.from(file.text), mode: file.mode });
  }
  const archive = cpioArchive(dedupe(entries));
  await mkdir(cacheDir, { recursive: true });
  const temporary = `${target}.${process.pid}.tmp`;
  await writeFile(temporary, archive);
  await rename(temporary, target);
  log('initramfs %s built (%d bytes)', target, archive.length);
  return { path: target, cached: false, bytes: archive.length };
}

/** Later entries of the same path lose: the first one wins (busybox's applets never shadow a real program). */
function dedupe(entries: CpioEntry[]): CpioEntry[] {
  const seen = new Set<string>();
  return entries.filter((entry) => {
    if (seen.has(entry.path)) return false;
    seen.add(entry.path);
    return true;
  });
}
