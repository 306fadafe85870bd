import { execFile } from 'node:child_process';
import { open, readFile, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { cpioArchive } from '@bmaas/agent';
import { LabSetupError } from './errors.js';
import type { GuestKernel } from './kernel.js';

/** A disk image {@link buildBootImage} made. */
export interface BootImage {
  /** The raw image: write it from a disk's first byte and the disk boots, under BIOS and under UEFI. */
  readonly path: string;
  readonly bytes: number;
  /**
   * What its boot prints on the serial console, at the start of a line of
   * its own; the line goes on with how it booted: `under BIOS`, or `under
   * UEFI, BootCurrent Boot0003 "<that entry's description>"`, then the boot ID.
   */
  readonly bootLine: string;
}

/** The GPT partition type of an EFI system partition. */
const ESP_TYPE = 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B';

/** Where the EFI system partition starts: 1 MiB, in 512-byte sectors (its FAT's hidden sectors say so too). */
const ESP_START_SECTOR = 2048;

/** The Debian packages that make an image, by the program each provides. */
const TOOLS = {
  'mkfs.fat': 'dosfstools',
  syslinux: 'syslinux',
  mcopy: 'mtools',
  mmd: 'mtools',
  sfdisk: 'fdisk',
  'grub-mkimage': 'grub-common',
} as const;

/** SYSLINUX's MBR for GPT disks: boots the partition marked legacy BIOS bootable. */
const GPT_MBR = { path: '/usr/lib/syslinux/mbr/gptmbr.bin', pkg: 'syslinux-common' };
/** GRUB's EFI modules, for `\EFI\BOOT\BOOTX64.EFI`. */
const GRUB_EFI = { path: '/usr/lib/grub/x86_64-efi/kernel.img', pkg: 'grub-efi-amd64-bin' };
const GRUB_MODULES = ['normal', 'fat', 'part_gpt', 'linux', 'boot', 'serial', 'terminal', 'echo'];

const KERNEL_ARGUMENTS = 'console=ttyS0 panic=-1 quiet';

/**
 * A small disk image for OS installation in the lab, bootable under BIOS
 * (SeaBIOS) and UEFI (OVMF) alike, made from this machine's Debian packages,
 * nothing downloaded: a GPT (`sfdisk`) with one partition, an EFI system
 * partition also marked legacy BIOS bootable, holding a FAT file system
 * (`mkfs.fat`) with Debian's kernel and an initramfs of busybox whose init
 * prints `bootLine` on the console, and how it booted, and waits.
 *
 * - Under UEFI, the partition's `\EFI\BOOT\BOOTX64.EFI` is a GRUB
 *   (`grub-mkimage`, Debian's modules) whose configuration inside loads the
 *   kernel from the partition it was loaded from: the loader the agent's
 *   boot entry names, and the one firmware falls back to without an entry.
 * - Under BIOS, the MBR's code is SYSLINUX's `gptmbr.bin`, which boots the
 *   partition marked legacy BIOS bootable: its boot sector and loader are
 *   SYSLINUX's (`syslinux --install`).
 *
 * One image for both, so the lab installs the same bytes on every VM
 * whatever its firmware. About 12 MB.
 *
 * @throws {@link LabSetupError} naming the Debian package of a missing tool
 */
export async function buildBootImage(dir: string, kernel: GuestKernel, marker: string): Promise<BootImage> {
  const image = path.join(dir, 'installed.img');
  const partition = path.join(dir, 'installed-esp.img');
  const initrd = path.join(dir, 'installed-initrd');
  const syslinuxCfg = path.join(dir, 'syslinux.cfg');
  const grubCfg = path.join(dir, 'grub.cfg');
  const loader = path.join(dir, 'BOOTX64.EFI');
  const bootLine = `lab: installed image ${marker} booted`;
  for (const file of [GPT_MBR, GRUB_EFI]) {
    await stat(file.path).catch(() => {
      throw new LabSetupError(`${file.path} is missing: install Debian's ${file.pkg} package`);
    });
  }
  await writeFile(initrd, await initramfs(bootLine, kernel));
  await writeFile(
    syslinuxCfg,
    `DEFAULT installed\nLABEL installed\n  KERNEL /vmlinuz\n  INITRD /initrd\n  APPEND ${KERNEL_ARGUMENTS}\n`,
  );
  // No device in the paths: GRUB's root is the partition it was loaded from.
  await writeFile(grubCfg, `linux /vmlinuz ${KERNEL_ARGUMENTS}\ninitrd /initrd\nboot\n`);
  await tool('grub-mkimage', ['-O', 'x86_64-efi', '-o', loader, '-p', '/EFI/BOOT', '-c', grubCfg, ...GRUB_MODULES]);

  const sizes = await Promise.all([kernel.image, initrd, loader].map(async (file) => (await stat(file)).size));
  // Room for the three, SYSLINUX's loader and the file system's own: in KiB, as mkfs.fat takes it.
  const kib = Math.ceil(sizes.reduce((a, b) => a + b, 0) / 1024) + 2048;
  await rm(partition, { force: true });
  // Hidden sectors: the partition's start, which SYSLINUX's boot sector adds to find its loader.
  await tool('mkfs.fat', ['-h', String(ESP_START_SECTOR), '-C', partition, String(kib)]);
  await tool('syslinux', ['--install', partition]);
  await tool('mmd', ['-i', partition, '::/EFI', '::/EFI/BOOT']);
  for (const [from, to] of [
    [kernel.image, 'vmlinuz'],
    [initrd, 'initrd'],
    [syslinuxCfg, 'syslinux.cfg'],
    [loader, 'EFI/BOOT/BOOTX64.EFI'],
  ] as const) {
    await tool('mcopy', ['-i', partition, from, `::/${to}`]);
  }

  // The partition, 1 MiB before it (MBR, GPT) and 1 MiB after (the backup GPT).
  const sectors = kib * 2;
  const bytes = (ESP_START_SECTOR + sectors + 2048) * 512;
  await rm(image, { force: true });
  await writeFile(image, '');
  const handle = await open(image, 'r+');
  try {
    await handle.truncate(bytes);
  } finally {
    await handle.close();
  }
  await tool(
    'sfdisk',
    ['--quiet', '--no-reread', '--no-tell-kernel', image],
    `label: gpt\nstart=${ESP_START_SECTOR}, size=${sectors}, type=${ESP_TYPE}, name="EFI system", attrs="LegacyBIOSBootable"\n`,
  );
  const out = await open(image, 'r+');
  try {
    // The MBR's boot code only (440 bytes): its partition table is the GPT's protective one, sfdisk's.
    await out.write(await readFile(GPT_MBR.path), 0, 440, 0);
    await out.write(await readFile(partition), 0, undefined, ESP_START_SECTOR * 512);
  } finally {
    await out.close();
  }
  await rm(partition, { force: true });
  return { path: image, bytes, bootLine };
}

/** Runs one of {@link TOOLS}, with `input` on its stdin. */
async function tool(program: keyof typeof TOOLS, args: string[], input?: string): Promise<void> {
  // mtools checks a disk's geometry against its size; a file system in a file has none to check.
  const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
  try {
    await new Promise<void>((resolve, reject) => {
      const child = execFile(program, args, { env }, (error) => (error ? reject(error) : resolve()));
      // A tool that reads nothing may exit before its stdin is closed: that is no failure of its own.
      child.stdin?.on('error', () => undefined);
      child.stdin?.end(input ?? '');
    });
  } catch (error) {
    const e = error as NodeJS.ErrnoException & { stderr?: string };
    if (e.code === 'ENOENT') {
      throw new LabSetupError(`${program} not found: install Debian's ${TOOLS[program]} package`);
    }
    throw new LabSetupError(`${program} ${args.join(' ')} failed: ${e.stderr?.trim() || e.message}`);
  }
}

/**
 * busybox as the whole userland: an init that says the image booted, how
 * (under UEFI: efivarfs mounted, BootCurrent and its entry's description,
 * read from the variables as UCS-2 up to its NUL), with the boot ID, and waits.
 */
async function initramfs(bootLine: string, kernel: GuestKernel): Promise<Buffer> {
  const busybox = await readFile('/bin/busybox').catch(() => {
    throw new LabSetupError("/bin/busybox not found: install Debian's busybox-static package");
  });
  // Debian builds efivarfs as a module.
  const efivarfs = await readFile(path.join(kernel.modules, 'kernel/fs/efivarfs/efivarfs.ko')).catch(() => undefined);
  const init = `#!/bin/sh
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
mount -t sysfs sysfs /sys
how="under BIOS"
if [ -d /sys/firmware/efi ]; then
  [ -f /lib/efivarfs.ko ] && insmod /lib/efivarfs.ko
  mount -t efivarfs efivarfs /sys/firmware/efi/efivars
  vars=/sys/firmware/efi/efivars
  global=8be4df61-93ca-11d2-aa0d-00e098032b8c
  # Read whole (efivarfs files give od no offset to skip to). BootCurrent: 4 bytes of attributes,
  # then the entry's number (16 bits, little-endian).
  set -- $(od -An -v -tu1 "$vars/BootCurrent-$global")
  entry=$(printf 'Boot%04X' $(($5 + 256 * $6)))
  # Boot####: attributes (4), EFI_LOAD_OPTION's attributes (4) and path length (2), then the description.
  set -- $(od -An -v -tu1 "$vars/$entry-$global")
  shift 10
  description=""
  while [ $# -ge 2 ] && [ "$1$2" != 00 ]; do
    description="$description$(printf "\\\\$(printf %o "$1")")"
    shift 2
  done
  how="under UEFI, BootCurrent $entry \\"$description\\""
fi
echo "${bootLine} $how, boot ID $(cat /proc/sys/kernel/random/boot_id)" > /dev/console
while true; do sleep 3600; done
`;
  return cpioArchive([
    { kind: 'dir', path: '/bin' },
    { kind: 'dir', path: '/dev' },
    { kind: 'dir', path: '/proc' },
    { kind: 'dir', path: '/sys' },
    { kind: 'dir', path: '/lib' },
    { kind: 'file', path: '/bin/busybox', data: busybox, mode: 0o755 },
    ...(efivarfs ? [{ kind: 'file' as const, path: '/lib/efivarfs.ko', data: efivarfs, mode: 0o644 }] : []),
    ...['sh', 'mount', 'cat', 'sleep', 'insmod', 'od', 'tr', 'printf'].map((name) => ({
      kind: 'symlink' as const,
      path: `/bin/${name}`,
      target: 'busybox',
    })),
    { kind: 'file', path: '/init', data: Buffer.from(init), mode: 0o755 },
  ]);
}
