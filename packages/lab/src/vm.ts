import { type ChildProcess, spawn } from 'node:child_process';
import { copyFile, mkdir, open, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import path from 'node:path';
import { SshKey } from '@bmaas/shepherd-manager';
import { VmError } from './errors.js';
import { CONFIG_SHARE, GUEST_SHARE } from './guest-files.js';
import type { GuestKernel } from './kernel.js';
import { log } from './log.js';
import { QemuPower } from './power.js';
import { QmpClient } from './qmp.js';

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
  /** Keys allowed to log in as root (authorized_keys lines): the shepherd's. */
  readonly authorizedKeys: readonly string[];
  /** Guest memory in MiB. Default 512. */
  readonly memory?: number;
  /** Size of its virtual disk in bytes (sparse; for OS installation). Default 4 GiB. */
  readonly diskSize?: number;
  /** The QEMU program. Default `qemu-system-x86_64`. */
  readonly qemu?: string;
}

/**
 * One QEMU virtual machine under software emulation (`-accel tcg`; KVM is not
 * to be had everywhere the lab runs): Debian's kernel, the lab's initramfs,
 * user-mode networking with the guest's sshd forwarded to an address of its
 * own on the host's loopback (the guest reaches the host at 10.0.2.2), a
 * virtual disk, and two QMP sockets: `bmc.qmp` for its BMC, `lab.qmp` for the
 * lab. Its host key is kept in its directory, so it stays the same across
 * reboots (the shepherd pins host keys).
 */
export class VirtualMachine {
  readonly power: QemuPower;
  readonly #child: ChildProcess;
  readonly exited: Promise<number | null>;
  readonly startedAt = Date.now();

  private constructor(
    readonly options: VirtualMachineOptions,
    child: ChildProcess,
  ) {
    this.#child = child;
    this.exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
    this.power = new QemuPower(options.name, this.bmcQmpSocket, path.join(options.dir, 'boot-device'));
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
  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** Writes its configuration and starts QEMU (the guest boots on its own). */
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
    const share = (id: string, dirPath: string) => [
      '-fsdev',
      `local,id=${id},path=${dirPath},security_model=none,readonly=on`,
      '-device',
      `virtio-9p-pci,fsdev=${id},mount_tag=${id}`,
    ];
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
      '-kernel',
      options.kernel.image,
      '-initrd',
      options.initramfs,
      '-append',
      'console=ttyS0 panic=-1 loglevel=4 mitigations=off',
      '-serial',
      `file:${path.join(dir, 'console.log')}`,
      '-netdev',
      `user,id=net0,hostfwd=tcp:${options.address}:${options.sshPort}-:22`,
      '-device',
      'virtio-net-pci,netdev=net0',
      ...share(GUEST_SHARE, options.guestDir),
      ...share(CONFIG_SHARE, config),
      '-drive',
      `file=${disk},format=raw,if=virtio`,
      '-qmp',
      `unix:${path.join(dir, 'bmc.qmp')},server=on,wait=off`,
      '-qmp',
      `unix:${path.join(dir, 'lab.qmp')},server=on,wait=off`,
      // Powered off by its guest, the VM stops rather than exits: its BMC powers it on again.
      '-no-shutdown',
    ];
    const child = spawn(options.qemu ?? 'qemu-system-x86_64', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString('utf8')).slice(-4000);
    });
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', (error: NodeJS.ErrnoException) =>
        reject(
          error.code === 'ENOENT'
            ? new VmError(
                options.name,
                `${options.qemu ?? 'qemu-system-x86_64'} not found: install Debian's qemu-system-x86 package`,
              )
            : error,
        ),
      );
    });
    const vm = new VirtualMachine(options, child);
    child.once('exit', (code, signal) => {
      if (code !== 0 || signal) log('%s: QEMU exited (%s): %s', options.name, signal ?? code, stderr.trim());
    });
    // QMP sockets exist once QEMU has set up its devices.
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await QmpClient.with(vm.labQmpSocket, (qmp) => qmp.execute('query-status'));
        break;
      } catch (error) {
        if (child.exitCode !== null)
          throw new VmError(options.name, `QEMU exited at start (code ${child.exitCode}): ${stderr.trim()}`);
        if (Date.now() > deadline)
          throw new VmError(options.name, 'QEMU did not open its QMP socket within 30 s', { cause: error });
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
    log('%s: QEMU %d started, SSH at %s:%d', options.name, child.pid, options.address, options.sshPort);
    return vm;
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
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /** Ends QEMU (`quit` over QMP, SIGKILL if that does not do it). */
  async stop(): Promise<void> {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    await QmpClient.with(this.labQmpSocket, (qmp) => qmp.execute('quit')).catch(() => undefined);
    const timer = setTimeout(() => this.#child.kill('SIGKILL'), 5_000);
    await this.exited;
    clearTimeout(timer);
  }
}

/** Whether an SSH server answers at host:port with its banner (slirp accepts before the guest does). */
function sshBanner(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(2_000, () => done(false));
    socket.once('data', (chunk) => done(chunk.toString('latin1').startsWith('SSH-')));
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
  });
}
