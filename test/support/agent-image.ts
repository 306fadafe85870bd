import { execFile } from 'node:child_process';
import { copyFile, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

/**
 * An agent image directory (`vmlinuz`, `initramfs`, `agent.iso`) small
 * enough for any test, with the real image's layout where the boot files
 * need it: an ISO with isolinux's boot record and a `/boot/config.cpio` that
 * each boot's ISO replaces. No 50 MiB image is built. Made under `dir`;
 * returns the image directory.
 */
export async function smallAgentImage(
  dir: string,
  files: { readonly vmlinuz?: Buffer | string; readonly initramfs?: Buffer | string } = {},
): Promise<string> {
  const vmlinuz = files.vmlinuz ?? 'kernel';
  const imageDir = path.join(dir, 'image');
  const isoRoot = path.join(dir, 'iso-root');
  await mkdir(path.join(isoRoot, 'boot'), { recursive: true });
  await mkdir(path.join(isoRoot, 'isolinux'), { recursive: true });
  await mkdir(imageDir, { recursive: true });
  await writeFile(path.join(imageDir, 'vmlinuz'), vmlinuz);
  await writeFile(path.join(imageDir, 'initramfs'), files.initramfs ?? 'initramfs');
  await writeFile(path.join(isoRoot, 'boot', 'vmlinuz'), vmlinuz);
  await writeFile(path.join(isoRoot, 'boot', 'config.cpio'), Buffer.alloc(0));
  // xorriso patches a boot info table into its copy: Debian's file stays untouched.
  await copyFile('/usr/lib/ISOLINUX/isolinux.bin', path.join(isoRoot, 'isolinux', 'isolinux.bin'));
  await run('xorriso', [
    ...['-as', 'mkisofs', '-quiet', '-o', path.join(imageDir, 'agent.iso'), '-V', 'BMAAS_AGENT', '-R', '-J'],
    ...['-b', 'isolinux/isolinux.bin', '-c', 'isolinux/boot.cat', '-no-emul-boot', '-boot-load-size', '4'],
    ...['-boot-info-table', isoRoot],
  ]);
  return imageDir;
}
