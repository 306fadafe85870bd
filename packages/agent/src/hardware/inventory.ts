import { BlockDevice_Protocol, EFISupport, type Node, NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { create } from '@bufbuild/protobuf';
import { driverlessMessage, readControllers } from './controllers.js';
import { type CpuRecord, readCpus } from './cpu.js';
import { type DiskRecord, readDisks } from './disks.js';
import { type MemoryRecord, readMemory } from './memory.js';
import { type NicRecord, readNics } from './nics.js';
import { readSmbios, readSystem, type SystemRecord } from './system.js';

/** Everything the agent found out about its machine, as plain records, and what it could not. */
export interface HardwareInventory {
  readonly system: SystemRecord;
  readonly memory: MemoryRecord;
  readonly cpus: readonly CpuRecord[];
  readonly disks: readonly DiskRecord[];
  readonly nics: readonly NicRecord[];
  /** What could not be read, for the report's warnings. */
  readonly warnings: readonly string[];
}

/**
 * Reads the machine under `root` (`/` on the machine itself): sysfs, procfs
 * and the SMBIOS table, one reader per kind of device. A PCI storage or
 * network controller without a driver is a warning: its disks or NICs are
 * missing from the report.
 */
export async function readHardware(root = '/'): Promise<HardwareInventory> {
  const warnings: string[] = [];
  const smbios = await readSmbios(root, warnings);
  const system = await readSystem(root, smbios);
  const memory = await readMemory(root, smbios, warnings);
  const cpus = await readCpus(root, warnings);
  const disks = await readDisks(root, warnings);
  const nics = await readNics(root);
  for (const controller of await readControllers(root)) {
    if (controller.driver === '') warnings.push(driverlessMessage(controller));
  }
  return { system, memory, cpus, disks, nics, warnings };
}

const PROTOCOLS: Record<DiskRecord['protocol'], BlockDevice_Protocol> = {
  scsi: BlockDevice_Protocol.SCSI,
  ata: BlockDevice_Protocol.ATA,
  nvme: BlockDevice_Protocol.NVME,
  mmc: BlockDevice_Protocol.MMC,
  // The report has no virtio protocol (upstream does not report virtio disks at all).
  virtio: BlockDevice_Protocol.UNKNOWN,
};

const EFI_SUPPORT: Record<SystemRecord['efiSupport'], EFISupport> = {
  unknown: EFISupport.EFI_SUPPORT_UNKNOWN,
  unsupported: EFISupport.EFI_SUPPORT_UNSUPPORTED,
  supported: EFISupport.EFI_SUPPORT_SUPPORTED,
  enabled: EFISupport.EFI_SUPPORT_ENABLED,
};

/** Bytes a second of a link of `mbps` megabits a second, as the report counts speeds. */
const BYTES_PER_MBPS = 1_000_000 / 8;

/** The inventory as the hardware report's `Node` (cloud/agent/api/hwreport.proto). */
export function hardwareNode(inventory: HardwareInventory): Node {
  const { system, memory, cpus, disks, nics } = inventory;
  return create(NodeSchema, {
    manufacturer: system.manufacturer,
    product: system.product,
    serialNumber: system.serialNumber,
    efiSupport: EFI_SUPPORT[system.efiSupport],
    memoryInstalledBytes: BigInt(memory.installedBytes),
    memoryUsableRatio: memory.installedBytes > 0 ? memory.usableBytes / memory.installedBytes : 0,
    cpu: cpus.map((cpu) => ({
      vendor: cpu.vendor,
      model: cpu.model,
      cores: cpu.cores,
      hardwareThreads: cpu.threads,
      ...(cpu.x86 && { architecture: { case: 'x8664' as const, value: cpu.x86 } }),
    })),
    blockDevice: disks.map((disk) => ({
      vendor: disk.vendor,
      deviceModel: disk.model,
      serialNumber: disk.serialNumber,
      wwn: disk.wwn === '' ? new Uint8Array() : Buffer.from(disk.wwn.slice(2), 'hex'),
      rotational: disk.rotational,
      capacityBytes: BigInt(disk.sizeBytes),
      logicalBlockSizeBytes: disk.logicalBlockSize,
      physicalBlockSizeBytes: disk.physicalBlockSize,
      protocol: PROTOCOLS[disk.protocol],
      criticalWarning: disk.health.criticalWarning ?? false,
    })),
    networkInterface: nics.map((nic) => ({
      mac: Buffer.from(nic.mac.replace(/:/g, ''), 'hex'),
      driver: nic.driver,
      linkUp: nic.linkUp,
      currentSpeedBytes: BigInt((nic.speedMbps ?? 0) * BYTES_PER_MBPS),
    })),
  });
}
