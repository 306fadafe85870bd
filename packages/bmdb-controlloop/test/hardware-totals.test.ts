import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import { describe, expect, test } from 'vitest';
import { hardwareTotals } from '../src/hardware-totals.js';

/** A message of `fields`, each written by its callback (the wire format by hand, as an agent's encoder may order it). */
function message(...fields: ((writer: BinaryWriter) => void)[]): Uint8Array {
  const writer = new BinaryWriter();
  for (const field of fields) field(writer);
  return writer.finish();
}
const varint = (number: number, value: bigint | number) => (w: BinaryWriter) =>
  w.tag(number, WireType.Varint).int64(value);
const bytes = (number: number, value: Uint8Array) => (w: BinaryWriter) =>
  w.tag(number, WireType.LengthDelimited).bytes(value);
const text = (number: number, value: string) => (w: BinaryWriter) =>
  w.tag(number, WireType.LengthDelimited).string(value);
const cpu = (threads: number) =>
  bytes(10, message(text(10, 'AuthenticAMD'), varint(9, threads), varint(8, Math.trunc(threads / 2))));
const disk = (capacity: bigint) => bytes(11, message(text(1, 'Samsung'), varint(6, capacity), varint(7, 512)));
/** An AgentHardwareReport whose `report` (field 1) is `node`, with a warning (field 2). */
const report = (...node: ((writer: BinaryWriter) => void)[]) =>
  message(bytes(1, message(...node)), text(2, 'no EFI variables'));

describe('hardware totals of an AgentHardwareReport', () => {
  test('sums threads over CPUs, counts disks and sums their capacity, takes the memory', () => {
    const totals = hardwareTotals(
      report(
        text(1, 'Supermicro'),
        varint(8, 512n * 2n ** 30n),
        cpu(64),
        cpu(64),
        disk(3_840_000_000_000n),
        disk(960n),
      ),
    );
    expect(totals).toEqual({ cpuThreads: 128, memoryBytes: 512 * 2 ** 30, disks: 2, diskBytes: 3_840_000_000_960 });
  });

  test('skips unknown fields of every wire type, in any order', () => {
    const unknown = (w: BinaryWriter) => {
      w.tag(99, WireType.Bit64).fixed64(7n);
      w.tag(98, WireType.Bit32).fixed32(7);
      w.tag(97, WireType.LengthDelimited).bytes(new Uint8Array([1, 2, 3]));
      w.tag(96, WireType.Varint).int32(-1);
    };
    const totals = hardwareTotals(
      message(unknown, bytes(1, message(cpu(8), unknown, disk(100n), varint(8, 1024))), unknown),
    );
    expect(totals).toEqual({ cpuThreads: 8, memoryBytes: 1024, disks: 1, diskBytes: 100 });
  });

  test('merges a node sent in two parts, the last memory winning, as protobuf parsers do', () => {
    const totals = hardwareTotals(
      message(bytes(1, message(varint(8, 1), cpu(4))), bytes(1, message(varint(8, 2048), cpu(2), disk(5n)))),
    );
    expect(totals).toEqual({ cpuThreads: 6, memoryBytes: 2048, disks: 1, diskBytes: 5 });
  });

  test('an empty report, or one without a node, is all zeros', () => {
    expect(hardwareTotals(new Uint8Array())).toEqual({ cpuThreads: 0, memoryBytes: 0, disks: 0, diskBytes: 0 });
    expect(hardwareTotals(message(text(2, 'warning only')))).toEqual({
      cpuThreads: 0,
      memoryBytes: 0,
      disks: 0,
      diskBytes: 0,
    });
  });

  test('negative figures count as 0 and absurd ones stop at 2^53 - 1 (a hostile agent cannot overflow a sum)', () => {
    const totals = hardwareTotals(report(varint(8, -5), cpu(-3), disk(2n ** 62n), disk(2n ** 62n)));
    expect(totals).toEqual({ cpuThreads: 0, memoryBytes: 0, disks: 2, diskBytes: Number.MAX_SAFE_INTEGER });
  });

  test('a malformed report has no totals', () => {
    const whole = report(cpu(64), disk(10n));
    expect(hardwareTotals(whole.subarray(0, whole.length - 3))).toBeUndefined();
    expect(hardwareTotals(new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]))).toBeUndefined();
    // Wire type 7 does not exist.
    expect(hardwareTotals(new Uint8Array([0x0f]))).toBeUndefined();
  });
});
