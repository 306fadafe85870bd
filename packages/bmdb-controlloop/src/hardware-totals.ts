import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';

/** What the fleet's hardware gauges sum over machines, read from one hardware report. */
export interface HardwareTotals {
  /** Hardware threads of all its CPUs. */
  readonly cpuThreads: number;
  readonly memoryBytes: number;
  /** Block devices. */
  readonly disks: number;
  /** Their capacity. */
  readonly diskBytes: number;
}

/*
 * Field numbers of the messages read, as in proto/cloud/bmaas/server/api/agent.proto
 * and proto/cloud/agent/api/hwreport.proto (wire-compatible with upstream's).
 */
const AgentHardwareReport = { report: 1 } as const;
const Node = { memoryInstalledBytes: 8, cpu: 10, blockDevice: 11 } as const;
const CPU = { hardwareThreads: 9 } as const;
const BlockDevice = { capacityBytes: 6 } as const;

/**
 * The totals of a serialized `cloud.bmaas.server.api.AgentHardwareReport`,
 * or undefined when it is not one (malformed: the report is kept, not
 * counted). Read at the wire level, so the library needs no generated code:
 * occurrences of a message field are merged and the last of a scalar wins,
 * as protobuf parsers do; unknown fields are skipped; a negative count or
 * size counts as 0, and every figure is at most 2^53 - 1.
 */
export function hardwareTotals(report: Uint8Array): HardwareTotals | undefined {
  try {
    const nodes = fieldsOf(report, AgentHardwareReport.report);
    let memoryBytes = 0;
    let cpuThreads = 0;
    let disks = 0;
    let diskBytes = 0;
    for (const node of nodes) {
      const reader = new BinaryReader(node);
      while (reader.pos < reader.len) {
        const [field, wireType] = reader.tag();
        if (field === Node.memoryInstalledBytes && wireType === WireType.Varint) {
          memoryBytes = atLeastZero(reader.int64());
        } else if (field === Node.cpu && wireType === WireType.LengthDelimited) {
          cpuThreads = bounded(cpuThreads + lastVarint(reader.bytes(), CPU.hardwareThreads));
        } else if (field === Node.blockDevice && wireType === WireType.LengthDelimited) {
          disks += 1;
          diskBytes = bounded(diskBytes + lastVarint(reader.bytes(), BlockDevice.capacityBytes));
        } else {
          reader.skip(wireType, field);
        }
      }
    }
    return { cpuThreads, memoryBytes, disks, diskBytes };
  } catch {
    return undefined;
  }
}

/** The values of every occurrence of length-delimited field `number`: a message field's parts, to merge. */
function fieldsOf(message: Uint8Array, number: number): Uint8Array[] {
  const reader = new BinaryReader(message);
  const parts: Uint8Array[] = [];
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === number && wireType === WireType.LengthDelimited) parts.push(reader.bytes());
    else reader.skip(wireType, field);
  }
  return parts;
}

/** The last value of varint field `number` of a message, 0 when absent or negative. */
function lastVarint(message: Uint8Array, number: number): number {
  const reader = new BinaryReader(message);
  let value = 0;
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === number && wireType === WireType.Varint) value = atLeastZero(reader.int64());
    else reader.skip(wireType, field);
  }
  return value;
}

function atLeastZero(value: bigint | string): number {
  return bounded(Number(value));
}

/**
 * From 0 to 2^53 - 1: exact as a number and within the columns' bigint, so
 * an absurd report (a hostile agent's) costs its own totals, not the
 * statement recording a batch of heartbeats.
 */
function bounded(value: number): number {
  return value > 0 ? Math.min(value, Number.MAX_SAFE_INTEGER) : 0;
}
