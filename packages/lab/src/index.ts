/**
 * The lab: QEMU virtual machines that boot Debian's kernel, BMCs that drive
 * them over QMP, and the shepherd around them.
 *
 * @packageDocumentation
 */

export { type CpioEntry, cpioArchive } from '@bmaas/agent';
export { type BootImage, buildBootImage } from './boot-image.js';
export {
  buildCloudImage,
  CLOUD_IMAGE_CACHE,
  type CloudImage,
  type CloudImageOptions,
} from './cloud-image.js';
export { LabSetupError, VmError } from './errors.js';
export { type GuestShare, prepareGuestShare } from './guest-share.js';
export { buildInitramfs, type Initramfs } from './initramfs.js';
export { findKernel, type GuestKernel } from './kernel.js';
export { LAB_SSH_PORT, Lab, type LabAgentBoot, type LabBmcProtocol, type LabMachine, type LabOptions } from './lab.js';
export { QemuPower, VM_BOOT_DEVICES, type VmBootDevice, type VmPowerState } from './power.js';
export { QmpClient, QmpCommandError, type QmpStatus } from './qmp.js';
export { QemuRedfishPower } from './redfish-power.js';
export {
  VirtualMachine,
  type VirtualMachineOptions,
  type VmBootSource,
  type VmDiskController,
  type VmFirmware,
} from './vm.js';
