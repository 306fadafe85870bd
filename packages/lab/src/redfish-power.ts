import {
  type FakeBootSource,
  type FakePowerBackend,
  FakePowerRefusal,
  type FakePowerState,
} from '@bmaas/provider-static/testing';
import type { QemuPower, VmBootDevice } from './power.js';

const BOOT_DEVICES: Record<FakeBootSource, VmBootDevice> = { None: 'default', Pxe: 'pxe', Hdd: 'disk', Cd: 'cdrom' };

/**
 * The fake Redfish BMC's power backend for a lab VM (the second beside
 * simulated power): Redfish's reset types reach the VM over QMP through
 * {@link QemuPower}: `On` powers it on (a fresh boot), `ForceOff` stops it,
 * `GracefulShutdown` presses ACPI's power button, `ForceRestart` and the
 * other restarts reset it (refused for a VM that is off, as the fake refuses
 * for its simulated systems), and a boot source override sets its next boot
 * device.
 */
export class QemuRedfishPower implements FakePowerBackend {
  constructor(private readonly power: QemuPower) {}

  state(): Promise<FakePowerState> {
    return this.power.state();
  }

  on(): Promise<void> {
    return this.power.on();
  }

  off(graceful: boolean): Promise<void> {
    return this.power.off({ graceful });
  }

  async restart(): Promise<void> {
    if ((await this.power.state()) === 'Off') throw new FakePowerRefusal('the system is powered off');
    await this.power.reset();
  }

  setBootSource(target: FakeBootSource): Promise<void> {
    return this.power.setBootDevice(BOOT_DEVICES[target]);
  }
}
