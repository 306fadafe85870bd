import { execFile } from 'node:child_process';
import { readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { cpioArchive } from '@bmaas/agent';
import { LabSetupError } from './errors.js';
import type { GuestKernel } from './kernel.js';

/** A disk image {@link buildBootImage} made. */
export interface BootImage {
  /** The raw image: write it from a disk's first byte and the disk boots. */
  readonly path: string;
  readonly bytes: number;
  /** What its first boot prints on the serial console, a line of its own. */
  readonly bootLine: string;
}

/** The Debian packages that make an image, by the program each provides. */
const TOOLS = { 'mkfs.fat': 'dosfstools', syslinux: 'syslinux', mcopy: 'mtools' } as const;

/**
 * A small bootable disk image for OS installation in the lab, made from this
 * machine's Debian packages, nothing downloaded: a FAT file system over the
 * whole disk (`mkfs.fat`, no partition table) whose boot sector is
 * SYSLINUX's (`syslinux --install`, which also writes its loader into the
 * file system), holding Debian's kernel and an initramfs of busybox whose
 * init prints `bootLine` on the console and waits. SeaBIOS boots it from a
 * VM's virtio disk like any MBR. About 10 MB.
 *
 * @throws {@link LabSetupError} naming the Debian package of a missing tool
 */
export async function buildBootImage(dir: string, kernel: GuestKernel, marker: string): Promise<BootImage> {
  const run = promisify(execFile);
  const image = path.join(dir, 'installed.img');
  const initrd = path.join(dir, 'installed-initrd');
  const config = path.join(dir, 'syslinux.cfg');
  const bootLine = `lab: installed image ${marker} booted`;
  await writeFile(initrd, await initramfs(bootLine));
  await writeFile(
    config,
    'DEFAULT installed\nLABEL installed\n  KERNEL vmlinuz\n  INITRD initrd\n  APPEND console=ttyS0 panic=-1 quiet\n',
  );
  const kernelBytes = (await readFile(kernel.image)).length;
  const initrdBytes = (await readFile(initrd)).length;
  // Room for both, SYSLINUX's loader and the file system's own: in KiB, as mkfs.fat takes it.
  const kib = Math.ceil((kernelBytes + initrdBytes) / 1024) + 2048;
  await rm(image, { force: true });
  // mtools checks a disk's geometry against its size; a file system on a whole disk image has none to check.
  const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
  const tool = async (program: keyof typeof TOOLS, args: string[]) => {
    try {
      await run(program, args, { env });
    } catch (error) {
      const e = error as NodeJS.ErrnoException & { stderr?: string };
      if (e.code === 'ENOENT') {
        throw new LabSetupError(`${program} not found: install Debian's ${TOOLS[program]} package`);
      }
      throw new LabSetupError(`${program} ${args.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
    }
  };
  await tool('mkfs.fat', ['-C', image, String(kib)]);
  await tool('syslinux', ['--install', image]);
  for (const [from, to] of [
    [kernel.image, 'vmlinuz'],
    [initrd, 'initrd'],
    [config, 'syslinux.cfg'],
  ] as const) {
    await tool('mcopy', ['-i', image, from, `::${to}`]);
  }
  return { path: image, bytes: kib * 1024, bootLine };
}

/** busybox as the whole userland: an init that says the image booted, with the boot ID, and waits. */
async function initramfs(bootLine: string): Promise<Buffer> {
  const busybox = await readFile('/bin/busybox').catch(() => {
    throw new LabSetupError("/bin/busybox not found: install Debian's busybox-static package");
  });
  const init = `#!/bin/sh
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
echo "${bootLine}, boot ID $(cat /proc/sys/kernel/random/boot_id)" > /dev/console
while true; do sleep 3600; done
`;
  return cpioArchive([
    { kind: 'dir', path: '/bin' },
    { kind: 'dir', path: '/dev' },
    { kind: 'dir', path: '/proc' },
    { kind: 'file', path: '/bin/busybox', data: busybox, mode: 0o755 },
    ...['sh', 'mount', 'cat', 'sleep'].map((name) => ({
      kind: 'symlink' as const,
      path: `/bin/${name}`,
      target: 'busybox',
    })),
    { kind: 'file', path: '/init', data: Buffer.from(init), mode: 0o755 },
  ]);
}
