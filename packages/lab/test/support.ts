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
