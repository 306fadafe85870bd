import { copyFile, link, mkdir, realpath, rename, stat } from 'node:fs/promises';
import path from 'node:path';
import { log } from './log.js';

/** What the guests share read-only at /opt/guest. */
export interface GuestShare {
  readonly dir: string;
}

/**
 * The directory every VM mounts at `/opt/guest` over virtio-9p: this host's
 * node binary (hard-linked, or copied once where it lives on another file
 * system; its C++ runtime is in the initramfs), for what a test runs in the
 * installed OS (the agent comes with its own node, in the takeover payload).
 * Sharing node keeps the initramfs small:
 * a 100 MB binary copied into every boot would cost memory and time.
 */
export async function prepareGuestShare(cacheDir: string, nodeBinary = process.execPath): Promise<GuestShare> {
  const node = await realpath(nodeBinary);
  const s = await stat(node);
  const dir = path.join(cacheDir, `guest-${Math.round(s.mtimeMs)}-${s.size}`);
  await mkdir(dir, { recursive: true });
  const shared = path.join(dir, 'node');
  if (!(await stat(shared).catch(() => undefined))) {
    const temporary = `${shared}.${process.pid}.tmp`;
    await link(node, temporary).catch(() => copyFile(node, temporary));
    await rename(temporary, shared);
    log('guest share: node %s in %s', node, dir);
  }
  return { dir };
}
