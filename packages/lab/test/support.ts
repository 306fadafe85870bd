import { existsSync } from 'node:fs';
import { IpmiSimulator, onPath } from '@bmaas/provider-static/testing';

/** What the lab's tests need from Debian, and the package of each; the tests skip, saying so, without them. */
export async function missingForLab(): Promise<string[]> {
  const missing: string[] = [];
  if (!(await onPath('qemu-system-x86_64'))) missing.push('qemu-system-x86');
  if (!(await IpmiSimulator.available())) missing.push('openipmi');
  if (!(await onPath('ipmitool'))) missing.push('ipmitool');
  if (!existsSync('/bin/busybox')) missing.push('busybox-static');
  if (!existsSync('/usr/sbin/sshd')) missing.push('openssh-server');
  // The OS installation's bootable image (boot-image.ts).
  if (!(await onPath('syslinux'))) missing.push('syslinux');
  if (!existsSync('/usr/lib/syslinux/modules/bios')) missing.push('syslinux-common');
  if (!(await onPath('mcopy'))) missing.push('mtools');
  if (!(await onPath('mkfs.fat'))) missing.push('dosfstools');
  if (!existsSync('/boot') || !(await import('node:fs')).readdirSync('/boot').some((f) => f.startsWith('vmlinuz-'))) {
    missing.push('linux-image-amd64');
  }
  return missing;
}

/** What booting the agent image in QEMU needs from Debian (the image's own tools, QEMU, OVMF for UEFI). */
export async function missingForAgentImage(): Promise<string[]> {
  const missing: string[] = [];
  if (!(await onPath('qemu-system-x86_64'))) missing.push('qemu-system-x86');
  if (!(await onPath('xorriso'))) missing.push('xorriso');
  if (!(await onPath('zstd'))) missing.push('zstd');
  if (!(await onPath('grub-mkimage'))) missing.push('grub-common');
  if (!(await onPath('mcopy'))) missing.push('mtools');
  if (!(await onPath('mkfs.fat'))) missing.push('dosfstools');
  if (!existsSync('/usr/lib/ISOLINUX/isolinux.bin')) missing.push('isolinux');
  if (!existsSync('/usr/lib/syslinux/modules/bios')) missing.push('syslinux-common');
  if (!existsSync('/usr/lib/grub/x86_64-efi/kernel.img')) missing.push('grub-efi-amd64-bin');
  if (!existsSync('/bin/busybox')) missing.push('busybox-static');
  if (!existsSync('/usr/share/OVMF/OVMF_CODE.fd')) missing.push('ovmf');
  if (!existsSync('/boot') || !(await import('node:fs')).readdirSync('/boot').some((f) => f.startsWith('vmlinuz-'))) {
    missing.push('linux-image-amd64');
  }
  return missing;
}
