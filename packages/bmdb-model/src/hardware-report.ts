import { BlockDevice_Protocol, EFISupport, type Node, NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { describeError } from '@bmaas/common';
import { fromBinary } from '@bufbuild/protobuf';
import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';

/**
 * A machine's last hardware report as plain records, for its detail (the
 * fleet page, its JSON): what the agent read from the machine's sysfs,
 * procfs and SMBIOS tables. Sizes are bytes, speeds bytes a second (as the
 * report counts them), each at most 2^53 - 1.
 */
export interface HardwareReport {
  /** DMI system vendor, product and serial number; empty where the firmware gave none. */
  readonly system: { readonly manufacturer: string; readonly product: string; readonly serialNumber: string };
  /**
   * How the machine booted: `EFI` when EFI runtime services were available,
   * `BIOS` when not (legacy boot, or EFI firmware in compatibility mode),
   * `unknown` when the agent did not say.
   */
  readonly boot: 'EFI' | 'BIOS' | 'unknown';
  /** The report's EFI support, as the agent reported it. */
  readonly efiSupport: 'invalid' | 'unknown' | 'unsupported' | 'supported' | 'enabled';
  readonly memory: {
    /** Installed (SMBIOS memory modules, else sysfs memory blocks). */
    readonly installedBytes: number;
    /** What the kernel can use, as a fraction of the installed (0 when unknown). */
    readonly usableRatio: number;
  };
  /** One record per CPU package (socket). */
  readonly cpus: readonly {
    readonly vendor: string;
    readonly model: string;
    readonly cores: number;
    readonly threads: number;
  }[];
  readonly disks: readonly HardwareDisk[];
  readonly nics: readonly {
    /** `aa:bb:cc:dd:ee:ff`. */
    readonly mac: string;
    readonly driver: string;
    readonly linkUp: boolean;
    /** The negotiated speed; 0 when unknown or without link. */
    readonly speedBytesPerSecond: number;
  }[];
  /** What the agent could not read. */
  readonly warnings: readonly string[];
}

/** One block device of a {@link HardwareReport}. */
export interface HardwareDisk {
  readonly vendor: string;
  readonly model: string;
  readonly serialNumber: string;
  /** `0x` and hex digits; empty when the disk has none. */
  readonly wwn: string;
  readonly sizeBytes: number;
  readonly logicalBlockSize: number;
  readonly physicalBlockSize: number;
  /** `unknown` covers virtio disks, which the report has no protocol for. */
  readonly protocol: 'unknown' | 'SCSI' | 'ATA' | 'NVMe' | 'MMC';
  readonly rotational: boolean;
  /** What the firmware says of its health, where the kernel exposes it. */
  readonly health: {
    /** The firmware expects the disk to fail soon. */
    readonly criticalWarning: boolean;
    readonly mediaErrors?: number;
    readonly availableSpareRatio?: number;
    readonly usageRatio?: number;
  };
}

/** A machine's stored hardware report: when it came, and what it says, or why it cannot be read. */
export interface MachineHardware {
  readonly reportedAt: Date;
  /** Undefined when the stored bytes are no hardware report (see `unreadable`). */
  readonly report: HardwareReport | undefined;
  /** Why the report could not be read. */
  readonly unreadable: string | undefined;
}

const PROTOCOLS: Record<BlockDevice_Protocol, HardwareDisk['protocol']> = {
  [BlockDevice_Protocol.UNKNOWN]: 'unknown',
  [BlockDevice_Protocol.SCSI]: 'SCSI',
  [BlockDevice_Protocol.ATA]: 'ATA',
  [BlockDevice_Protocol.NVME]: 'NVMe',
  [BlockDevice_Protocol.MMC]: 'MMC',
};

const EFI_SUPPORT: Record<EFISupport, HardwareReport['efiSupport']> = {
  [EFISupport.EFI_SUPPORT_INVALID]: 'invalid',
  [EFISupport.EFI_SUPPORT_UNKNOWN]: 'unknown',
  [EFISupport.EFI_SUPPORT_UNSUPPORTED]: 'unsupported',
  [EFISupport.EFI_SUPPORT_SUPPORTED]: 'supported',
  [EFISupport.EFI_SUPPORT_ENABLED]: 'enabled',
};

/** Field numbers of `cloud.bmaas.server.api.AgentHardwareReport` (the same under `cloud.agent.api`). */
const AgentHardwareReport = { report: 1, warning: 2 } as const;

/**
 * Decodes a serialized `cloud.bmaas.server.api.AgentHardwareReport`, as the
 * library stores it. The wrapper is read at the wire level (its `Node`'s
 * occurrences merged, as protobuf parsers do), the `Node` with the
 * generated code of hwreport.proto. Throws on bytes that are no report.
 */
export function decodeHardwareReport(raw: Uint8Array): HardwareReport {
  const nodes: Uint8Array[] = [];
  const warnings: string[] = [];
  const reader = new BinaryReader(raw);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === AgentHardwareReport.report && wireType === WireType.LengthDelimited) nodes.push(reader.bytes());
    else if (field === AgentHardwareReport.warning && wireType === WireType.LengthDelimited)
      warnings.push(reader.string());
    else reader.skip(wireType, field);
  }
  return fromNode(fromBinary(NodeSchema, Buffer.concat(nodes)), warnings);
}

function fromNode(node: Node, warnings: readonly string[]): HardwareReport {
  const efiSupport = EFI_SUPPORT[node.efiSupport] ?? 'invalid';
  return {
    system: { manufacturer: node.manufacturer, product: node.product, serialNumber: node.serialNumber },
    boot: efiSupport === 'enabled' ? 'EFI' : efiSupport === 'invalid' ? 'unknown' : 'BIOS',
    efiSupport,
    memory: { installedBytes: bounded(node.memoryInstalledBytes), usableRatio: node.memoryUsableRatio },
    cpus: node.cpu.map((cpu) => ({
      vendor: cpu.vendor,
      model: cpu.model,
      cores: cpu.cores,
      threads: cpu.hardwareThreads,
    })),
    disks: node.blockDevice.map((disk) => ({
      vendor: disk.vendor,
      model: disk.deviceModel,
      serialNumber: disk.serialNumber,
      wwn: disk.wwn.length === 0 ? '' : `0x${Buffer.from(disk.wwn).toString('hex')}`,
      sizeBytes: bounded(disk.capacityBytes),
      logicalBlockSize: disk.logicalBlockSizeBytes,
      physicalBlockSize: disk.physicalBlockSizeBytes,
      protocol: PROTOCOLS[disk.protocol] ?? 'unknown',
      rotational: disk.rotational,
      health: {
        criticalWarning: disk.criticalWarning,
        ...(disk.mediaErrors !== undefined && { mediaErrors: bounded(disk.mediaErrors) }),
        ...(disk.availableSpareRatio !== undefined && { availableSpareRatio: disk.availableSpareRatio }),
        ...(disk.usageRatio !== undefined && { usageRatio: disk.usageRatio }),
      },
    })),
    nics: node.networkInterface.map((nic) => ({
      mac: [...nic.mac].map((byte) => byte.toString(16).padStart(2, '0')).join(':'),
      driver: nic.driver,
      linkUp: nic.linkUp,
      speedBytesPerSecond: bounded(nic.currentSpeedBytes),
    })),
    warnings,
  };
}

/** From 0 to 2^53 - 1, as the totals count (hardware-totals.ts). */
function bounded(value: bigint): number {
  return value > 0n ? Number(value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : value) : 0;
}

/** The stored report as a machine's detail shows it: decoded, or why not. */
export function machineHardware(raw: Uint8Array, reportedAt: Date): MachineHardware {
  try {
    return { reportedAt, report: decodeHardwareReport(raw), unreadable: undefined };
  } catch (error) {
    return {
      reportedAt,
      report: undefined,
      unreadable: `the stored hardware report is not one: ${describeError(error)}`,
    };
  }
}
