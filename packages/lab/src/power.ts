import { readFile, writeFile } from 'node:fs/promises';
import { log } from './log.js';
import { QmpClient, type QmpStatus } from './qmp.js';

/** A VM's power as a BMC reports it. */
export type VmPowerState = 'On' | 'Off';

/** Devices a BMC may boot the VM from next, as QEMU's `-boot` letters name them. */
export const VM_BOOT_DEVICES = { disk: 'c', cdrom: 'd', pxe: 'n' } as const;
export type VmBootDevice = keyof typeof VM_BOOT_DEVICES | 'default';

/**
 * A QEMU VM's power, driven over QMP as a BMC drives a machine's: what the
 * IPMI BMC's chassis control and the fake Redfish BMC's power backend both
 * use. QEMU runs with `-no-shutdown`, so the VM's process outlives its power:
 *
 * - on: the VM runs (`query-status` is `running`); anything else is off;
 * - off (forced): `stop`, the CPU halts where it is, as if the power were cut;
 * - off (graceful): `system_powerdown`, ACPI's power button; the guest shuts
 *   down (busybox's acpid runs `poweroff`) and QEMU stops in `shutdown`;
 * - on from off: `system_reset` then `cont`: a fresh boot, never a resume;
 * - reset: `system_reset`, a hard reset of a running VM;
 * - boot device: HMP `boot_set` for the next boot, remembered in a file so it
 *   can be read back.
 */
export class QemuPower {
  constructor(
    /** The VM's name, for logs. */
    readonly vm: string,
    /** Its QMP socket. */
    readonly qmpSocket: string,
    /** Where the boot device override is kept. */
    readonly bootDeviceFile: string,
  ) {}

  async state(): Promise<VmPowerState> {
    const status = await QmpClient.with(this.qmpSocket, (qmp) => qmp.execute<QmpStatus>('query-status'));
    return status.status === 'running' ? 'On' : 'Off';
  }

  async on(): Promise<void> {
    await QmpClient.with(this.qmpSocket, async (qmp) => {
      const status = await qmp.execute<QmpStatus>('query-status');
      if (status.status === 'running') return;
      await qmp.execute('system_reset');
      await qmp.execute('cont');
    });
    log('%s: power on', this.vm);
  }

  async off(options: { graceful?: boolean } = {}): Promise<void> {
    await QmpClient.with(this.qmpSocket, (qmp) => qmp.execute(options.graceful ? 'system_powerdown' : 'stop'));
    log('%s: power off%s', this.vm, options.graceful ? ' (graceful)' : '');
  }

  async reset(): Promise<void> {
    await QmpClient.with(this.qmpSocket, (qmp) => qmp.execute('system_reset'));
    log('%s: reset', this.vm);
  }

  /** Off, then on: a fresh boot whatever the state was. */
  async cycle(): Promise<void> {
    await QmpClient.with(this.qmpSocket, async (qmp) => {
      await qmp.execute('stop');
      await qmp.execute('system_reset');
      await qmp.execute('cont');
    });
    log('%s: power cycle', this.vm);
  }

  async bootDevice(): Promise<VmBootDevice> {
    const text = (await readFile(this.bootDeviceFile, 'utf8').catch(() => 'default')).trim();
    return text === 'disk' || text === 'cdrom' || text === 'pxe' ? text : 'default';
  }

  /** The device the next boot starts from (`default`: the VM's own order). */
  async setBootDevice(device: VmBootDevice): Promise<void> {
    if (device !== 'default') {
      const letter = VM_BOOT_DEVICES[device];
      await QmpClient.with(this.qmpSocket, (qmp) =>
        qmp.execute('human-monitor-command', { 'command-line': `boot_set ${letter}` }),
      );
    }
    await writeFile(this.bootDeviceFile, `${device}\n`);
    log('%s: boot device %s', this.vm, device);
  }
}
