import { type ChildProcess, spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { access, copyFile, mkdir, open, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import path from 'node:path';
import { SshKey } from '@bmaas/shepherd-manager';
import { VmError } from './errors.js';
import { CONFIG_SHARE, GUEST_SHARE } from './guest-files.js';
import type { GuestKernel } from './kernel.js';
import { log } from './log.js';
import { QemuPower, type VmBootDevice } from './power.js';
import { QmpClient, type QmpStatus } from './qmp.js';

/** Options of {@link VirtualMachine.start}. */
export interface VirtualMachineOptions {
  /** Its name: host name in the guest, inventory `id`. */
  readonly name: string;
  /** Its own directory: QMP sockets, console log, disk, configuration. Made if missing. */
  readonly dir: string;
  readonly kernel: GuestKernel;
  readonly initramfs: string;
  /** Shared read-only at `/opt/guest` (the node binary and the test agent). */
  readonly guestDir: string;
  /** Its own loopback address on the host, `127.0.1.11`: SSH reaches the guest there. */
  readonly address: string;
  /** The host port forwarded to the guest's sshd (22). */
  readonly sshPort: number;
  /**
   * The guest's address the forward to its sshd goes to: QEMU's first DHCP
   * address, `10.0.2.15`, by default; another for an OS given a static one.
   */
  readonly sshGuestAddress?: string;
  /** Keys allowed to log in as root (authorized_keys lines): the shepherd's. */
  readonly authorizedKeys: readonly string[];
  /** Guest memory in MiB. Default 512. */
  readonly memory?: number;
  /** Its virtual disk's serial number (`-drive serial=`, at most 20 characters), as its hardware report shows it. */
  readonly diskSerial?: string;
  /** Its NIC's MAC address (`-device ...,mac=`). Default QEMU's. */
  readonly mac?: string;
  /** Size of its virtual disk in bytes (sparse; for OS installation). Default 4 GiB. */
  readonly diskSize?: number;
  /** The QEMU program. Default `qemu-system-x86_64`. */
  readonly qemu?: string;
  /** Its firmware: SeaBIOS (`bios`, QEMU's own, the default) or OVMF (`uefi`, Debian's ovmf package). */
  readonly firmware?: VmFirmware;
  /**
   * A blank machine: no lab kernel, no installed OS. It boots what its boot
   * device says from its own devices: its disk (by default; empty, nothing
   * boots), its CD drive (`cdrom`: the virtual media its BMC inserted) or its
   * NIC (`pxe`: the NIC's iPXE ROM, given `netBootFile` by QEMU's DHCP).
   */
  readonly blank?: boolean;
  /** The boot file QEMU's user-mode DHCP hands a network boot (an `http://` URL iPXE fetches). */
  readonly netBootFile?: string;
  /** What its disk sits behind. Default `virtio`. */
  readonly diskController?: VmDiskController;
}

/** A VM's firmware: SeaBIOS or OVMF. */
export type VmFirmware = 'bios' | 'uefi';

/**
 * What a VM's disk sits behind: a virtio block device (`virtio`, the
 * default), a MegaRAID SAS controller (`megasas`: QEMU's `megasas-gen2`,
 * Linux's megaraid_sas, a disk SeaBIOS boots but OVMF has no driver for), or
 * an NVMe controller (`nvme`, which OVMF boots and SeaBIOS does too).
 */
export type VmDiskController = 'virtio' | 'megasas' | 'nvme';

/** Debian's OVMF (package ovmf): its code, read-only, and the variable store each UEFI VM gets a copy of. */
const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE.fd';
const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS.fd';

/**
 * What QEMU boots: the lab's kernel and initramfs (the default: the machine's
 * "network boot"), or its disk; a blank VM its disk, its CD drive or its NIC.
 */
export type VmBootSource = 'kernel' | 'disk' | 'cdrom' | 'network';

/**
 * One QEMU virtual machine under software emulation (`-accel tcg`; KVM is not
 * to be had everywhere the lab runs): Debian's kernel, the lab's initramfs,
 * user-mode networking with the guest's sshd forwarded to an address of its
 * own on the host's loopback (the guest reaches the host at 10.0.2.2), a
 * virtual disk, and three QMP sockets: `bmc.qmp` for its BMC, `lab.qmp` for
 * the lab, `events.qmp` for the lab's watch of its resets. Its host key is
 * kept in its directory, so it stays the same across reboots (the shepherd
 * pins host keys).
 *
 * The BMC's boot device decides each boot, as firmware does: the lab's
 * kernel boots unless it is `disk`, and then the disk boots (its MBR, through
 * SeaBIOS; under OVMF, what its NVRAM's BootOrder says). QEMU always boots `-kernel` first when given one, so at every
 * reset (the guest's reboot, a BMC's power on, cycle or reset) whose boot
 * device wants the other source, QEMU is started again with it: the same
 * disk, sockets and console log, a fresh boot.
 */
export class VirtualMachine {
  readonly power: QemuPower;
  #child: ChildProcess;
  #bootSource: VmBootSource;
  /** The watch of resets on `events.qmp`. */
  #events: QmpClient | undefined;
  /** A restart under way: resets meanwhile wait for it. */
  #switching: Promise<void> = Promise.resolve();
  #stopping = false;
  readonly #exited: Promise<number | null>;
  #resolveExited!: (code: number | null) => void;
  readonly startedAt = Date.now();
  /** When its last reset came (the guest's reboot, a BMC's power on, cycle or reset): its last boot's start. */
  lastResetAt: number | undefined;

  private constructor(
    readonly options: VirtualMachineOptions,
    child: ChildProcess,
    bootSource: VmBootSource,
  ) {
    this.#child = child;
    this.#bootSource = bootSource;
    this.#exited = new Promise((resolve) => {
      this.#resolveExited = resolve;
    });
    this.#watchExit(child);
    this.power = new QemuPower(options.name, this.bmcQmpSocket, path.join(options.dir, 'boot-device'));
  }

  /** Resolves when QEMU exits for good (not when it is started again to boot another source). */
  get exited(): Promise<number | null> {
    return this.#exited;
  }

  get name(): string {
    return this.options.name;
  }
  /** The QMP socket its BMC drives it through. */
  get bmcQmpSocket(): string {
    return path.join(this.options.dir, 'bmc.qmp');
  }
  /** The lab's own QMP socket. */
  get labQmpSocket(): string {
    return path.join(this.options.dir, 'lab.qmp');
  }
  get consoleLog(): string {
    return path.join(this.options.dir, 'console.log');
  }
  /** The QEMU process now (another after a switch of boot source). */
  get pid(): number | undefined {
    return this.#child.pid;
  }
  /** What the running QEMU boots. */
  get bootSource(): VmBootSource {
    return this.#bootSource;
  }
  get firmware(): VmFirmware {
    return this.options.firmware ?? 'bios';
  }
  /** The file a blank VM's CD drive holds, named in this file (none: the drive is empty). */
  get #mediaFile(): string {
    return path.join(this.options.dir, 'cdrom-media');
  }

  /**
   * Puts `file` in a blank VM's CD drive (`undefined`: ejects what it holds),
   * as its BMC's virtual media does: over QMP (`blockdev-change-medium`,
   * `eject`) into the running QEMU, and kept in the VM's directory for the
   * QEMU a reset starts again (a switch of boot source).
   */
  async setMedia(file: string | undefined): Promise<void> {
    if (!this.options.blank) throw new VmError(this.name, 'has no CD drive: only a blank VM has one');
    await writeFile(this.#mediaFile, file ?? '');
    // A restart under way reads the file; the QEMU running after it gets the medium over QMP as well.
    await this.#switching.catch(() => undefined);
    await QmpClient.with(this.bmcQmpSocket, (qmp) =>
      file === undefined
        ? qmp.execute('eject', { id: CDROM_DEVICE, force: true })
        : qmp.execute('blockdev-change-medium', {
            id: CDROM_DEVICE,
            filename: file,
            format: 'raw',
            'read-only-mode': 'read-only',
          }),
    );
    log('%s: CD drive %s', this.name, file === undefined ? 'ejected' : `holds ${file}`);
  }

  /** A UEFI VM's variable store (its NVRAM): a copy of OVMF's, kept across its reboots and QEMU's restarts. */
  get efiVariables(): string {
    return path.join(this.options.dir, 'OVMF_VARS.fd');
  }

  /** Writes its configuration and starts QEMU (the guest boots on its own, from what its boot device says). */
  static async start(options: VirtualMachineOptions): Promise<VirtualMachine> {
    const { dir } = options;
    await mkdir(path.join(dir, 'config'), { recursive: true, mode: 0o700 });
    const hostKey = await SshKey.loadOrGenerate(path.join(dir, 'ssh_host_ed25519_key'), { comment: options.name });
    const config = path.join(dir, 'config');
    await rm(path.join(config, 'ssh_host_ed25519_key'), { force: true });
    await copyFile(hostKey.path, path.join(config, 'ssh_host_ed25519_key'));
    await writeFile(path.join(config, 'authorized_keys'), `${options.authorizedKeys.join('\n')}\n`);
    await writeFile(path.join(config, 'hostname'), `${options.name}\n`);
    const disk = path.join(dir, 'disk.img');
    const handle = await open(disk, 'a');
    try {
      if ((await handle.stat()).size === 0) await handle.truncate(options.diskSize ?? 4 * 1024 ** 3);
    } finally {
      await handle.close();
    }
    if (options.firmware === 'uefi') {
      for (const file of [OVMF_CODE, OVMF_VARS]) {
        await access(file).catch(() => {
          throw new VmError(options.name, `${file} not found: install Debian's ovmf package`);
        });
      }
      // Copied once: the variables the agent writes (its boot entry, BootOrder) stay, as NVRAM does.
      await copyFile(OVMF_VARS, path.join(dir, 'OVMF_VARS.fd'), constants.COPYFILE_EXCL).catch(
        (error: NodeJS.ErrnoException) => {
          if (error.code !== 'EEXIST') throw error;
        },
      );
    }
    const bootSource = bootSourceOf(
      await new QemuPower(options.name, '', path.join(dir, 'boot-device')).bootDevice(),
      options.blank === true,
    );
    const child = await launch(options, bootSource);
    const vm = new VirtualMachine(options, child, bootSource);
    try {
      await vm.#ready(child);
    } catch (error) {
      child.kill('SIGKILL');
      throw error;
    }
    log(
      '%s: QEMU %d started (booting %s), SSH at %s:%d',
      options.name,
      child.pid,
      bootSource,
      options.address,
      options.sshPort,
    );
    return vm;
  }

  /** Waits for QEMU's QMP sockets, then watches its resets. */
  async #ready(child: ChildProcess): Promise<void> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await QmpClient.with(this.labQmpSocket, (qmp) => qmp.execute('query-status'));
        break;
      } catch (error) {
        if (child.exitCode !== null)
          throw new VmError(this.name, `QEMU exited at start (code ${child.exitCode}): ${stderrOf(child)}`);
        if (Date.now() > deadline)
          throw new VmError(this.name, 'QEMU did not open its QMP socket within 30 s', { cause: error });
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
    const events = await QmpClient.connect(path.join(this.options.dir, 'events.qmp'));
    events.onEvent((event) => {
      if (event.event !== 'RESET') return;
      this.lastResetAt = Date.now();
      this.#switching = this.#switching.then(() => this.#afterReset(event.data));
    });
    this.#events = events;
  }

  /**
   * At a reset, boots what the boot device wants: the same QEMU if it boots
   * that already, else QEMU started again with it. A BMC's reset comes with
   * more commands on its own socket (`cont` after `system_reset`): those go
   * to the old QEMU first, which is then left once it runs again.
   */
  async #afterReset(data: unknown): Promise<void> {
    if (this.#stopping) return;
    const wanted = bootSourceOf(await this.power.bootDevice(), this.options.blank === true);
    if (wanted === this.#bootSource) return;
    if (!(data as { guest?: boolean } | undefined)?.guest) {
      for (const deadline = Date.now() + 2_000; Date.now() < deadline; ) {
        const status = await QmpClient.with(this.labQmpSocket, (qmp) => qmp.execute<QmpStatus>('query-status')).catch(
          () => undefined,
        );
        if (status?.status === 'running') break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
    if (this.#stopping) return;
    const old = this.#child;
    this.#events?.close();
    this.#events = undefined;
    this.#bootSource = wanted;
    await QmpClient.with(this.labQmpSocket, (qmp) => qmp.execute('quit')).catch(() => undefined);
    await new Promise<void>((resolve) =>
      old.exitCode !== null || old.signalCode !== null ? resolve() : old.once('exit', () => resolve()),
    );
    const child = await launch(this.options, wanted);
    this.#child = child;
    this.#watchExit(child);
    await this.#ready(child);
    log('%s: boot device wants %s: QEMU %d started again, booting it', this.name, wanted, child.pid);
  }

  #watchExit(child: ChildProcess): void {
    child.once('exit', (code, signal) => {
      if (child !== this.#child) return;
      if (!this.#stopping && (code !== 0 || signal))
        log('%s: QEMU exited (%s): %s', this.name, signal ?? code, stderrOf(child));
      this.#resolveExited(code);
    });
  }

  /** Resolves once the guest's sshd sends its banner through the forward. */
  async waitForSsh(timeout = 120_000, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + timeout;
    while (!(await sshBanner(this.options.address, this.options.sshPort))) {
      signal?.throwIfAborted();
      if (this.#child.exitCode !== null) throw new VmError(this.name, `QEMU exited (code ${this.#child.exitCode})`);
      if (Date.now() > deadline)
        throw new VmError(
          this.name,
          `no SSH banner at ${this.options.address}:${this.options.sshPort} within ${timeout} ms`,
        );
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  }

  /** Ends QEMU (`quit` over QMP, SIGKILL if that does not do it). */
  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#switching.catch(() => undefined);
    this.#events?.close();
    const child = this.#child;
    if (child.exitCode !== null || child.signalCode !== null) return;
    await QmpClient.with(this.labQmpSocket, (qmp) => qmp.execute('quit')).catch(() => undefined);
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await this.#exited;
    clearTimeout(timer);
  }
}

/** Whether an SSH server answers at host:port with its banner (slirp accepts before the guest does). */
export function sshBanner(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    // Generous: under load an emulated sshd takes seconds to answer, and each probe given up on
    // leaves it a connection to finish; a pile of them trips its MaxStartups and it drops them all.
    socket.setTimeout(15_000, () => done(false));
    socket.once('data', (chunk) => done(chunk.toString('latin1').startsWith('SSH-')));
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
  });
}

/**
 * The BMC's boot device as what QEMU boots: the disk for `disk`, the lab's
 * kernel for anything else; a blank VM's CD drive for `cdrom`, its NIC for
 * `pxe`, its disk otherwise.
 */
function bootSourceOf(device: VmBootDevice, blank: boolean): VmBootSource {
  if (blank) return device === 'cdrom' ? 'cdrom' : device === 'pxe' ? 'network' : 'disk';
  return device === 'disk' ? 'disk' : 'kernel';
}

/** A blank VM's CD drive, as QMP names it. */
const CDROM_DEVICE = 'cdrom0';

const STDERR = new WeakMap<ChildProcess, string>();

function stderrOf(child: ChildProcess): string {
  return (STDERR.get(child) ?? '').trim();
}

/** Starts QEMU for the VM, booting `bootSource`; resolves once the process runs. */
async function launch(options: VirtualMachineOptions, bootSource: VmBootSource): Promise<ChildProcess> {
  const { dir } = options;
  const share = (id: string, dirPath: string) => [
    '-fsdev',
    `local,id=${id},path=${dirPath},security_model=none,readonly=on`,
    '-device',
    `virtio-9p-pci,fsdev=${id},mount_tag=${id}`,
  ];
  if (options.blank) return spawnQemu(options, blankDevices(options, bootSource, await currentMedia(dir)));
  const boot =
    bootSource === 'kernel'
      ? [
          '-kernel',
          options.kernel.image,
          '-initrd',
          options.initramfs,
          '-append',
          'console=ttyS0 panic=-1 loglevel=4 mitigations=off',
        ]
      : options.firmware === 'uefi'
        ? []
        : ['-boot', 'order=c'];
  const uefi = options.firmware === 'uefi';
  const firmware = uefi
    ? [
        '-drive',
        `if=pflash,format=raw,readonly=on,file=${OVMF_CODE}`,
        '-drive',
        `if=pflash,format=raw,file=${path.join(dir, 'OVMF_VARS.fd')}`,
      ]
    : [];
  // SeaBIOS boots the disk by its bootindex. OVMF would too, and more: given any bootindex (QEMU's
  // "bootorder" fw_cfg file), it rewrites BootOrder at every boot to put the entries matching those
  // devices first, and the agent's entry (a partition and a file, no PCI path) matches none, so
  // OVMF's own entry for the disk would boot instead of it. Without one, OVMF leaves BootOrder as
  // the agent wrote it. The network boot needs none either way: -kernel boots before any entry.
  const bootIndex = uefi ? '' : ',bootindex=1';
  return spawnQemu(options, [
    ...firmware,
    ...boot,
    '-netdev',
    `user,id=net0,${sshForward(options)}`,
    '-device',
    `virtio-net-pci,netdev=net0${options.mac ? `,mac=${options.mac}` : ''}`,
    ...share(GUEST_SHARE, options.guestDir),
    ...share(CONFIG_SHARE, path.join(dir, 'config')),
    // The disk as a device of its own: the drive's serial= is gone from newer QEMUs, the device's is not.
    '-drive',
    `file=${path.join(dir, 'disk.img')},format=raw,if=none,id=disk0`,
    ...diskDevices(options, bootIndex),
  ]);
}

/**
 * The devices of a VM's disk (the drive `disk0`) behind its controller, with
 * `bootIndex` (`,bootindex=N` or nothing) and its serial number: a SCSI
 * disk's is its VPD serial, an NVMe controller's (which QEMU requires) its
 * namespace's disk serial as Linux shows it.
 */
function diskDevices(options: VirtualMachineOptions, bootIndex: string): string[] {
  const serial = options.diskSerial ? `,serial=${options.diskSerial}` : '';
  switch (options.diskController ?? 'virtio') {
    case 'virtio':
      return ['-device', `virtio-blk-pci,drive=disk0${bootIndex}${serial}`];
    case 'megasas':
      return ['-device', 'megasas-gen2,id=scsi0', '-device', `scsi-hd,drive=disk0,bus=scsi0.0${bootIndex}${serial}`];
    case 'nvme':
      return ['-device', `nvme,drive=disk0${bootIndex},serial=${options.diskSerial ?? options.name.slice(0, 20)}`];
  }
}

/** QEMU's forward of the VM's host address and port to its guest's sshd. */
function sshForward(options: VirtualMachineOptions): string {
  return `hostfwd=tcp:${options.address}:${options.sshPort}-${options.sshGuestAddress ?? ''}:22`;
}

/** The file a blank VM's CD drive holds, as `setMedia` left it; `undefined` when empty. */
async function currentMedia(dir: string): Promise<string | undefined> {
  const text = (await readFile(path.join(dir, 'cdrom-media'), 'utf8').catch(() => '')).trim();
  return text === '' ? undefined : text;
}

/**
 * A blank VM's devices: its disk, its CD drive (holding `media`) and its NIC,
 * the one `bootSource` names first in the boot order (`bootindex`), the disk
 * after it, as firmware tries a machine's devices. No lab kernel, no shares:
 * nothing of the lab's runs in it.
 */
function blankDevices(options: VirtualMachineOptions, bootSource: VmBootSource, media: string | undefined): string[] {
  const uefi = options.firmware === 'uefi';
  const order = (source: VmBootSource) => (source === bootSource ? ',bootindex=1' : '');
  const disk = bootSource === 'disk' ? ',bootindex=1' : ',bootindex=2';
  const netdev = [
    'user,id=net0',
    sshForward(options),
    ...(options.netBootFile ? [`bootfile=${options.netBootFile}`] : []),
  ].join(',');
  return [
    ...(uefi
      ? [
          '-drive',
          `if=pflash,format=raw,readonly=on,file=${OVMF_CODE}`,
          '-drive',
          `if=pflash,format=raw,file=${path.join(options.dir, 'OVMF_VARS.fd')}`,
        ]
      : []),
    '-netdev',
    netdev,
    '-device',
    `virtio-net-pci,netdev=net0${options.mac ? `,mac=${options.mac}` : ''}${order('network')}`,
    '-drive',
    `if=none,id=cd0,media=cdrom,readonly=on${media ? `,format=raw,file=${media}` : ''}`,
    '-device',
    `ide-cd,drive=cd0,id=${CDROM_DEVICE}${order('cdrom')}`,
    '-drive',
    `file=${path.join(options.dir, 'disk.img')},format=raw,if=none,id=disk0`,
    ...diskDevices(options, disk),
  ];
}

/** Starts QEMU with the lab's common options and `devices`; resolves once the process runs. */
async function spawnQemu(options: VirtualMachineOptions, devices: readonly string[]): Promise<ChildProcess> {
  const { dir } = options;
  const args = [
    '-name',
    options.name,
    '-accel',
    'tcg',
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-m',
    String(options.memory ?? 512),
    '-smp',
    '1',
    ...devices,
    // Appended to, so the console of every boot stays, whichever QEMU booted it.
    '-chardev',
    `file,id=console,path=${path.join(dir, 'console.log')},append=on`,
    '-serial',
    'chardev:console',
    '-qmp',
    `unix:${path.join(dir, 'bmc.qmp')},server=on,wait=off`,
    '-qmp',
    `unix:${path.join(dir, 'lab.qmp')},server=on,wait=off`,
    '-qmp',
    `unix:${path.join(dir, 'events.qmp')},server=on,wait=off`,
    // Powered off by its guest, the VM stops rather than exits: its BMC powers it on again.
    '-no-shutdown',
  ];
  const qemu = options.qemu ?? 'qemu-system-x86_64';
  const child = spawn(qemu, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  STDERR.set(child, '');
  child.stderr?.on('data', (chunk: Buffer) => {
    STDERR.set(child, (stderrOf(child) + chunk.toString('utf8')).slice(-4000));
  });
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (error: NodeJS.ErrnoException) =>
      reject(
        error.code === 'ENOENT'
          ? new VmError(options.name, `${qemu} not found: install Debian's qemu-system-x86 package`)
          : error,
      ),
    );
  });
  return child;
}
