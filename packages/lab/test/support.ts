import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { EFISupport } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { IpmiSimulator, onPath } from '@bmaas/provider-static/testing';
import { AgentHardwareReportSchema } from '@bmaas/server';
import { fromBinary } from '@bufbuild/protobuf';
import { type StartedAgent, startedAgents } from '../../../test/support/agents.js';
import type { TestDatabase } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import type { Lab, LabMachine } from '../src/index.js';

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
  if (!(await onPath('sfdisk'))) missing.push('fdisk');
  if (!existsSync('/boot') || !(await import('node:fs')).readdirSync('/boot').some((f) => f.startsWith('vmlinuz-'))) {
    missing.push('linux-image-amd64');
  }
  // The agent image the VMs are taken over into; OVMF, the UEFI VM's firmware (lab-vm3).
  for (const pkg of await missingForAgentImage()) {
    if (!missing.includes(pkg)) missing.push(pkg);
  }
  return missing;
}

/** What the lab's blank machines need besides the lab's: the NIC's iPXE ROM QEMU boots the network with. */
export async function missingForBlankLab(): Promise<string[]> {
  const missing = await missingForLab();
  if (!existsSync('/usr/lib/ipxe/qemu/efi-virtio.rom')) missing.push('ipxe-qemu');
  return missing;
}

/** A process as `/proc` shows it: its ID with its start time, so a reused ID is not taken for it. */
export interface ProcessRecord {
  readonly pid: number;
  readonly startTime: string;
  readonly command: string;
}

/** `pid`'s descendants, all generations, read from `/proc`. */
export function descendants(pid: number): ProcessRecord[] {
  const children = new Map<number, ProcessRecord[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = statOf(Number(entry));
    if (stat === undefined) continue;
    const record = { pid: Number(entry), startTime: stat.startTime, command: commandOf(Number(entry)) };
    children.set(stat.ppid, [...(children.get(stat.ppid) ?? []), record]);
  }
  const found: ProcessRecord[] = [];
  const walk = (parent: number) => {
    for (const child of children.get(parent) ?? []) {
      found.push(child);
      walk(child.pid);
    }
  };
  walk(pid);
  return found;
}

/** Whether the process still runs: the same start time under its ID, and not a zombie. */
export function isRunning(process: ProcessRecord): boolean {
  const stat = statOf(process.pid);
  return stat !== undefined && stat.startTime === process.startTime && stat.state !== 'Z';
}

function statOf(pid: number): { state: string; ppid: number; startTime: string } | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // After the command's closing parenthesis (the command may hold any character): state, ppid, … starttime (22nd).
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { state: fields[0] ?? '', ppid: Number(fields[1]), startTime: fields[19] ?? '' };
}

function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
  } catch {
    return '';
  }
}

/** What booting the agent image in QEMU needs from Debian (the image's own tools, QEMU, OVMF for UEFI). */
export async function missingForAgentImage(): Promise<string[]> {
  const missing: string[] = [];
  if (!(await onPath('qemu-system-x86_64'))) missing.push('qemu-system-x86');
  if (!(await onPath('xorriso'))) missing.push('xorriso');
  if (!existsSync('/usr/sbin/kexec')) missing.push('kexec-tools');
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

/** The disk serials, MACs and EFI support of a machine's stored hardware report, as its agent sent it. */
export async function reportedHardware(
  db: TestDatabase,
  machineId: string,
): Promise<{ serials: string[]; macs: string[]; efi: EFISupport }> {
  const { rows } = await db.admin('SELECT hardware_report_raw FROM machine_hardware_report WHERE machine_id = $1', [
    machineId,
  ]);
  const report = fromBinary(AgentHardwareReportSchema, rows[0].hardware_report_raw).report;
  return {
    serials: report?.blockDevice.map((disk) => disk.serialNumber) ?? [],
    macs:
      report?.networkInterface.map((nic) => [...nic.mac].map((byte) => byte.toString(16).padStart(2, '0')).join(':')) ??
      [],
    efi: report?.efiSupport ?? EFISupport.EFI_SUPPORT_INVALID,
  };
}

/**
 * Waits for `check` as `eventually` does; when it times out, the error
 * carries the tails of the lab's `shepherd run` and `shepherd server`
 * output, which say why a VM's step never came.
 */
export async function labEventually<T>(
  lab: Lab,
  what: string,
  check: () => Promise<T | undefined>,
  timeout: number,
  interval: number,
): Promise<T> {
  try {
    return await eventually(what, check, timeout, interval);
  } catch (error) {
    throw new Error(
      `${(error as Error).message}\nshepherd run:\n${lab.run?.output.slice(-4000)}\nshepherd server:\n${lab.server?.output.slice(-2000)}`,
    );
  }
}

/** `machine`'s started agent once it heartbeats and its hardware report is stored, else undefined. */
export async function enrolledWithHardwareReport(
  db: TestDatabase,
  machine: LabMachine,
): Promise<StartedAgent | undefined> {
  const found = (await startedAgents(db, 'providerId')).get(machine.id);
  if (found === undefined || found.heartbeatAgo === null) return undefined;
  const { rows } = await db.admin('SELECT 1 FROM machine_hardware_report WHERE machine_id = $1', [found.machineId]);
  return rows.length > 0 ? found : undefined;
}

/** The time since `since` (a `Date.now()`), as the lab's timing lines print it. */
export function seconds(since: number): string {
  return `${((Date.now() - since) / 1000).toFixed(1)} s`;
}

/**
 * A lab test's timing lines: each printed as it is recorded, with the load
 * average beside it, and all again under the test's total time at its end
 * (Vitest's output of a long run buries the first ones).
 */
export class LabTimings {
  readonly #started = Date.now();
  readonly #lines: string[] = [];

  constructor(readonly test: string) {}

  record(line: string): void {
    const text = `${this.test} timing: ${line} (load ${loadavg()[0]?.toFixed(2)})`;
    this.#lines.push(text);
    console.log(text);
  }

  /** Prints the test's time in all and every line recorded. */
  summarize(): void {
    console.log(`${this.test} test: ${seconds(this.#started)} in all\n${this.#lines.join('\n')}`);
  }
}
