/**
 * The lab's building blocks on real parts: an initramfs built from this
 * machine's Debian packages (cached: the second build is a read), a QEMU VM
 * booting Debian's kernel to its sshd on an address of its own, node running
 * in the guest, and OpenIPMI's ipmi_sim driving the VM over QMP through the
 * lab's chassis control: ipmitool's reset reboots it (a new boot ID), off
 * stops it, on boots it afresh, soft has the guest power itself off, and the
 * boot device is kept. Timings are printed with the load average.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { IpmiClient, type IpmiTarget, Secret } from '@bmaas/provider-static';
import { IpmiSimulator } from '@bmaas/provider-static/testing';
import { Ssh2Client, SshKey } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { eventually } from '../../../test/support/wait.js';
import {
  buildInitramfs,
  findKernel,
  type GuestKernel,
  type Initramfs,
  prepareGuestShare,
  QmpClient,
  type QmpStatus,
  VirtualMachine,
} from '../src/index.js';
import { missingForLab } from './support.js';

const missing = await missingForLab();
if (missing.length > 0) {
  console.warn(`lab VM tests skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const CACHE = fileURLToPath(new URL('../../../.tmp/lab-cache', import.meta.url));
const CHASSIS_CONTROL = fileURLToPath(new URL('../dist/chassis-control.js', import.meta.url));

function timing(what: string, ms: number): void {
  console.log(`lab timing: ${what}: ${(ms / 1000).toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`);
}

describe.skipIf(missing.length > 0)('a lab VM driven by ipmi_sim', () => {
  let dir: string;
  let kernel: GuestKernel;
  let initramfs: Initramfs;
  let key: SshKey;
  let vm: VirtualMachine;
  let bmc: IpmiSimulator;
  const ipmi = new IpmiClient({ timeout: 20_000, retryDelay: 200 });
  let target: IpmiTarget;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'lab-vm-test-'));
    kernel = findKernel();
    initramfs = await buildInitramfs(CACHE, kernel, process.execPath);
    const share = await prepareGuestShare(CACHE);
    key = await SshKey.loadOrGenerate(path.join(dir, 'shepherd_key'));
    const started = Date.now();
    vm = await VirtualMachine.start({
      name: 'lab-test-vm',
      dir: path.join(dir, 'vm'),
      kernel,
      initramfs: initramfs.path,
      guestDir: share.dir,
      address: '127.0.1.201',
      sshPort: 2222,
      authorizedKeys: [key.authorizedKey],
    });
    timing('QEMU started, QMP up', Date.now() - started);
    const quote = (s: string) => `'${s}'`;
    bmc = await IpmiSimulator.start({
      host: '127.0.1.201',
      password: 'lab-ipmi',
      chassisControl: [process.execPath, CHASSIS_CONTROL, vm.bmcQmpSocket, path.join(dir, 'vm', 'boot-device')]
        .map(quote)
        .join(' '),
    });
    target = {
      machine: vm.name,
      host: bmc.host,
      port: bmc.port,
      username: bmc.username,
      password: new Secret(bmc.password),
      cipherSuite: 3,
    };
  }, 120_000);
  afterAll(async () => {
    await bmc?.close();
    await vm?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function ssh(command: string): Promise<string> {
    const client = new Ssh2Client({ privateKey: key.privateKey });
    const connection = await client.dial({ host: '127.0.1.201', port: 2222 }, { connectTimeout: 5_000 });
    try {
      const result = await connection.execute(command, new Uint8Array());
      expect(result.exitCode, Buffer.from(result.stderr).toString()).toBe(0);
      return Buffer.from(result.stdout).toString('utf8').trim();
    } finally {
      await connection.close();
    }
  }

  async function bootId(): Promise<string> {
    return ssh('cat /proc/sys/kernel/random/boot_id');
  }

  async function qemuStatus(): Promise<string> {
    return (await QmpClient.with(vm.labQmpSocket, (qmp) => qmp.execute<QmpStatus>('query-status'))).status;
  }

  test('the initramfs comes from the cache the second time', async () => {
    const again = await buildInitramfs(CACHE, kernel, process.execPath);
    expect(again).toEqual({ path: initramfs.path, cached: true, bytes: initramfs.bytes });
  });

  test('the VM boots to its sshd, and node runs in it', async () => {
    await vm.waitForSsh(180_000);
    timing('boot to sshd', Date.now() - vm.startedAt);
    expect(await ssh('hostname')).toBe('lab-test-vm');
    const started = Date.now();
    expect(await ssh('/opt/guest/node -e "console.log(process.version)"')).toBe(process.version);
    timing('node -e in the guest (over SSH)', Date.now() - started);
    // The guest reaches the host at slirp's 10.0.2.2.
    expect(await ssh('ip route')).toContain('default via 10.0.2.2');
  }, 240_000);

  test("ipmitool's reset reboots the VM: a new boot ID", async () => {
    expect(await ipmi.powerState(target)).toBe('On');
    const before = await bootId();
    const started = Date.now();
    await ipmi.power(target, 'reset');
    await eventually(
      'a new boot ID',
      async () => {
        const now = await bootId().catch(() => undefined);
        return now !== undefined && now !== before ? now : undefined;
      },
      180_000,
      500,
    );
    timing('IPMI reset to sshd again', Date.now() - started);
  }, 240_000);

  test('off stops the VM, on boots it afresh', async () => {
    const before = await bootId();
    await ipmi.power(target, 'off');
    expect(await ipmi.powerState(target)).toBe('Off');
    expect(await qemuStatus()).toBe('paused');
    const started = Date.now();
    await ipmi.power(target, 'on');
    expect(await ipmi.powerState(target)).toBe('On');
    await eventually(
      'a new boot ID after power on',
      async () => {
        const now = await bootId().catch(() => undefined);
        return now !== undefined && now !== before ? now : undefined;
      },
      180_000,
      500,
    );
    timing('IPMI power on to sshd', Date.now() - started);
  }, 240_000);

  test('soft off: the guest powers itself off (ACPI power button, acpid)', async () => {
    const started = Date.now();
    await ipmi.power(target, 'soft');
    await eventually(
      'the guest off',
      async () => ((await qemuStatus()) === 'shutdown' ? true : undefined),
      120_000,
      200,
    );
    expect(await ipmi.powerState(target)).toBe('Off');
    timing('IPMI soft off to the guest off', Date.now() - started);
    await ipmi.power(target, 'on');
    await vm.waitForSsh(180_000);
  }, 300_000);

  test('the boot device is kept, and decides the next boot: the disk, then the lab’s kernel again', async () => {
    await ipmi.setBootDevice(target, 'pxe');
    expect(await vm.power.bootDevice()).toBe('pxe');
    await ipmi.setBootDevice(target, 'disk');
    expect(await vm.power.bootDevice()).toBe('disk');
    expect(vm.bootSource).toBe('kernel');
    // A BMC's power cycle boots the disk (empty here: SeaBIOS finds nothing to boot, and waits); the VM stays on.
    const kernelPid = vm.pid;
    let started = Date.now();
    await ipmi.power(target, 'cycle');
    await eventually(
      'the disk booted',
      async () => (vm.bootSource === 'disk' && vm.pid !== kernelPid ? true : undefined),
      60_000,
      100,
    );
    expect(await ipmi.powerState(target)).toBe('On');
    timing('IPMI power cycle to QEMU booting the disk', Date.now() - started);
    // Back to the network boot: the next cycle boots the lab's kernel, sshd and all.
    await ipmi.setBootDevice(target, 'pxe');
    started = Date.now();
    await ipmi.power(target, 'cycle');
    await eventually('the kernel booted', async () => (vm.bootSource === 'kernel' ? true : undefined), 60_000, 100);
    await vm.waitForSsh(180_000);
    timing('IPMI power cycle to the lab’s kernel and sshd again', Date.now() - started);
  }, 300_000);
});
