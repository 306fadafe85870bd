import { rm } from 'node:fs/promises';
import path from 'node:path';
import {
  type FakeBootSource,
  type FakePowerBackend,
  FakePowerRefusal,
  type FakePowerState,
} from '@bmaas/provider-static/testing';
import { VmError } from './errors.js';
import type { QemuPower, VmBootDevice } from './power.js';
import { downloadMedia } from './virtual-media.js';
import type { VirtualMachine } from './vm.js';

const BOOT_DEVICES: Record<FakeBootSource, VmBootDevice> = { None: 'default', Pxe: 'pxe', Hdd: 'disk', Cd: 'cdrom' };

/**
 * The fake Redfish BMC's power backend for a lab VM (the second beside
 * simulated power): Redfish's reset types reach the VM over QMP through
 * {@link QemuPower}: `On` powers it on (a fresh boot), `ForceOff` stops it,
 * `GracefulShutdown` presses ACPI's power button, `ForceRestart` and the
 * other restarts reset it (refused for a VM that is off, as the fake refuses
 * for its simulated systems), and a boot source override sets its next boot
 * device. A blank VM's virtual media is its CD drive: `InsertMedia`
 * downloads the image into the VM's directory and puts it in the drive,
 * `EjectMedia` empties the drive.
 */
export class QemuRedfishPower implements FakePowerBackend {
  private readonly power: QemuPower;

  constructor(private readonly vm: VirtualMachine) {
    this.power = vm.power;
  }

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

  async setMedia(image: string | undefined): Promise<void> {
    if (!this.vm.options.blank) throw new VmError(this.vm.name, 'has no virtual media: only a blank VM has');
    const file = path.join(this.vm.options.dir, 'virtual-media.iso');
    if (image === undefined) {
      await this.vm.setMedia(undefined);
      await rm(file, { force: true });
      return;
    }
    await downloadMedia(this.vm.name, image, file);
    await this.vm.setMedia(file);
  }
}
