/**
 * The BMaaS agent: heartbeats to the BMaaS server (`runAgent`), reads the machine's hardware for its hardware report
 * (sysfs, procfs and the SMBIOS table, one reader per kind of device), and
 * chooses its install disk by root-device hints, and installs a disk image
 * on it safely (its first MiB last, after the checksum; a UEFI boot entry);
 * and builds the agent environment it boots into (`buildAgentImage`: kernel,
 * initramfs, an ISO for BIOS and UEFI, the takeover payload) and one
 * machine's config for it, with the network a takeover captured
 * (`captureNetwork`), or, for a machine its BMC boots, the enrollment token
 * its agent enrolls with (`agentEnrollmentArchive`, `bmaas-agent enroll`).
 *
 * @packageDocumentation
 */

// agentEnrollmentArchive takes the token as a Secret: its users need not add @bmaas/common.
export { Secret } from '@bmaas/common';
export { type AgentEnd, type AgentOptions, runAgent } from './agent.js';
export type { AgentService } from './callback/heartbeat-client.js';
export type { CpuRecord } from './hardware/cpu.js';
export type { DiskHealth, DiskProtocol, DiskRecord } from './hardware/disks.js';
export { type HardwareInventory, hardwareNode, readHardware } from './hardware/inventory.js';
export type { MemoryRecord } from './hardware/memory.js';
export type { NicRecord } from './hardware/nics.js';
export type { EfiSupport, SystemRecord } from './hardware/system.js';
export { type AgentImage, type AgentImageOptions, buildAgentImage } from './image/build.js';
export {
  type AgentBootConfig,
  type AgentEnrollmentConfig,
  type AgentNetwork,
  agentConfigArchive,
  agentEnrollmentArchive,
} from './image/config.js';
export { type CpioEntry, cpioArchive } from './image/cpio.js';
export { AgentImageError } from './image/errors.js';
export type { MissingFirmware } from './image/firmware.js';
export { AGENT_KERNEL_ARGUMENTS, configureAgentIso } from './image/iso.js';
export { type BootKernel, findKernel, moduleOrder, sharedLibraries } from './image/kernel.js';
export { InstallationError, type InstallationProblem } from './install/errors.js';
export { type Installed, type InstallOptions, install } from './install/install.js';
export { type DiskImage, type WriteImageOptions, type WrittenImage, writeDiskImage } from './install/write-image.js';
export { captureNetwork } from './network/capture.js';
export type { CapturedNetwork, NetworkConfig, NetworkInterface, NetworkRoute } from './network/config.js';
export {
  chooseRootDevice,
  parseRootDeviceHints,
  RootDeviceHintError,
  type RootDeviceHintProblem,
  type RootDeviceHints,
  RootDeviceNotFoundError,
} from './root-device-hints.js';
