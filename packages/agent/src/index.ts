/**
 * The BMaaS agent: heartbeats to the BMaaS server (`runAgent`), reads the machine's hardware for its hardware report
 * (sysfs, procfs and the SMBIOS table, one reader per kind of device), and
 * chooses its install disk by root-device hints, and installs a disk image
 * on it safely (its first MiB last, after the checksum; a UEFI boot entry).
 *
 * @packageDocumentation
 */

export { type AgentEnd, type AgentOptions, runAgent } from './agent.js';
export type { AgentService } from './callback/heartbeat-client.js';
export type { CpuRecord } from './hardware/cpu.js';
export type { DiskHealth, DiskProtocol, DiskRecord } from './hardware/disks.js';
export { type HardwareInventory, hardwareNode, readHardware } from './hardware/inventory.js';
export type { MemoryRecord } from './hardware/memory.js';
export type { NicRecord } from './hardware/nics.js';
export type { EfiSupport, SystemRecord } from './hardware/system.js';
export { InstallationError, type InstallationProblem } from './install/errors.js';
export { type Installed, type InstallOptions, install } from './install/install.js';
export { type DiskImage, type WriteImageOptions, type WrittenImage, writeDiskImage } from './install/write-image.js';
export {
  chooseRootDevice,
  parseRootDeviceHints,
  RootDeviceHintError,
  type RootDeviceHintProblem,
  type RootDeviceHints,
  RootDeviceNotFoundError,
} from './root-device-hints.js';
