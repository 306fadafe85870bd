import { copyFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { AgentImageError } from './errors.js';
import { tool } from './tools.js';

/** The ISO's volume ID: GRUB finds the ISO by it under UEFI. */
export const ISO_VOLUME = 'BMAAS_AGENT';
/**
 * The agent kernel's command line, from the ISO and from iPXE alike: the console is the first
 * serial port (the last console= wins /dev/console), where a BMC's serial-over-LAN shows it.
 */
export const AGENT_KERNEL_ARGUMENTS = 'console=tty0 console=ttyS0,115200 panic=10';

/** Boot-loader files from Debian's packages: isolinux (BIOS), GRUB's EFI modules. */
export const BOOT_FILES = {
  isolinux: { path: '/usr/lib/ISOLINUX/isolinux.bin', pkg: 'isolinux' },
  isohybridMbr: { path: '/usr/lib/ISOLINUX/isohdpfx.bin', pkg: 'isolinux' },
  ldlinux: { path: '/usr/lib/syslinux/modules/bios/ldlinux.c32', pkg: 'syslinux-common' },
  grubEfi: { path: '/usr/lib/grub/x86_64-efi/kernel.img', pkg: 'grub-efi-amd64-bin' },
} as const;

const GRUB_MODULES = [
  'normal',
  'search',
  'search_label',
  'iso9660',
  'fat',
  'part_gpt',
  'part_msdos',
  'linux',
  'boot',
  'serial',
  'terminal',
  'echo',
  'test',
  'efi_gop',
  'all_video',
];

const ISOLINUX_CFG = `SERIAL 0 115200
DEFAULT agent
PROMPT 0
TIMEOUT 0
LABEL agent
  KERNEL /boot/vmlinuz
  INITRD /boot/initramfs,/boot/config.cpio
  APPEND ${AGENT_KERNEL_ARGUMENTS}
`;

const GRUB_CFG = `serial --unit=0 --speed=115200
terminal_input console serial
terminal_output console serial
search --no-floppy --set=root --label ${ISO_VOLUME}
echo "Booting the BMaaS agent environment"
linux /boot/vmlinuz ${AGENT_KERNEL_ARGUMENTS}
initrd /boot/initramfs /boot/config.cpio
boot
`;

/** The files and checks the ISO needs, before anything is built. */
export async function checkBootFiles(): Promise<void> {
  for (const file of Object.values(BOOT_FILES)) {
    await stat(file.path).catch(() => {
      throw new AgentImageError(`${file.path} is missing: install Debian's ${file.pkg} package`);
    });
  }
}

/** What the ISO holds beyond its boot loaders. */
export interface IsoContent {
  readonly kernel: string;
  readonly initramfs: string;
  /** The config initramfs the ISO loads after the image's (an empty archive in the generic ISO). */
  readonly config: string;
}

/**
 * Writes a hybrid ISO (`xorriso -as mkisofs`) at `target`: isolinux for BIOS
 * (El Torito, and an MBR for a USB stick), and for UEFI an El Torito EFI
 * system partition image (`mkfs.fat`, `mcopy`) holding `\EFI\BOOT\BOOTX64.EFI`,
 * a GRUB built with `grub-mkimage` from Debian's modules with its
 * configuration inside, which finds the ISO by its volume ID.
 */
export async function writeIso(work: string, content: IsoContent, target: string): Promise<void> {
  const isolinuxCfg = path.join(work, 'isolinux.cfg');
  const grubCfg = path.join(work, 'grub.cfg');
  const efiBinary = path.join(work, 'BOOTX64.EFI');
  const efiImage = path.join(work, 'efiboot.img');
  const isolinux = path.join(work, 'isolinux.bin');
  await writeFile(isolinuxCfg, ISOLINUX_CFG);
  await writeFile(grubCfg, GRUB_CFG);
  // xorriso patches the boot info table into its copy of isolinux.bin; keep Debian's file untouched.
  await copyFile(BOOT_FILES.isolinux.path, isolinux);
  await tool('grub-mkimage', ['-O', 'x86_64-efi', '-o', efiBinary, '-p', '/boot/grub', '-c', grubCfg, ...GRUB_MODULES]);
  const efiKib = Math.ceil((await stat(efiBinary)).size / 1024) + 512;
  await rm(efiImage, { force: true });
  await tool('mkfs.fat', ['-C', efiImage, String(efiKib)]);
  await tool('mmd', ['-i', efiImage, '::/EFI', '::/EFI/BOOT']);
  await tool('mcopy', ['-i', efiImage, efiBinary, '::/EFI/BOOT/BOOTX64.EFI']);
  const temporary = `${target}.${process.pid}.tmp`;
  await tool('xorriso', [
    '-as',
    'mkisofs',
    '-quiet',
    '-o',
    temporary,
    '-V',
    ISO_VOLUME,
    '-R',
    '-J',
    '-isohybrid-mbr',
    BOOT_FILES.isohybridMbr.path,
    '-b',
    'isolinux/isolinux.bin',
    '-c',
    'isolinux/boot.cat',
    '-no-emul-boot',
    '-boot-load-size',
    '4',
    '-boot-info-table',
    '-eltorito-alt-boot',
    '-e',
    'boot/efiboot.img',
    '-no-emul-boot',
    '-isohybrid-gpt-basdat',
    '-graft-points',
    `isolinux/isolinux.bin=${isolinux}`,
    `isolinux/ldlinux.c32=${BOOT_FILES.ldlinux.path}`,
    `isolinux/isolinux.cfg=${isolinuxCfg}`,
    `boot/efiboot.img=${efiImage}`,
    `boot/grub/grub.cfg=${grubCfg}`,
    `boot/vmlinuz=${content.kernel}`,
    `boot/initramfs=${content.initramfs}`,
    `boot/config.cpio=${content.config}`,
  ]);
  await rename(temporary, target);
}

/**
 * A copy of an agent ISO at `target` whose `/boot/config.cpio` is `config`
 * (one machine's {@link agentConfigArchive}), for a BMC's virtual media; the
 * boot records are replayed as they were.
 */
export async function configureAgentIso(iso: string, config: string, target: string): Promise<void> {
  await rm(target, { force: true });
  await tool('xorriso', [
    '-indev',
    iso,
    '-outdev',
    target,
    '-boot_image',
    'any',
    'replay',
    '-update',
    config,
    '/boot/config.cpio',
  ]);
}
