import { BlockDevice_Protocol, EFISupport, NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { create, toBinary } from '@bufbuild/protobuf';
import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import { describe, expect, test } from 'vitest';
import { decodeHardwareReport, machineHardware } from '../src/hardware-report.js';

/** An AgentHardwareReport (report = 1, warning = 2) around `node`, written at the wire level as a server stores it. */
function agentHardwareReport(node: Uint8Array, ...warnings: string[]): Uint8Array {
  const writer = new BinaryWriter().tag(1, WireType.LengthDelimited).bytes(node);
  for (const warning of warnings) writer.tag(2, WireType.LengthDelimited).string(warning);
  return writer.finish();
}

describe("a machine's hardware report, decoded for its detail", () => {
  test('disk health as far as reported, BIOS boot, MACs and WWNs as text, and the warnings', () => {
    const node = create(NodeSchema, {
      manufacturer: 'Supermicro',
      product: 'SYS-1029P-WTR',
      serialNumber: 'S12345',
      efiSupport: EFISupport.EFI_SUPPORT_SUPPORTED,
      memoryInstalledBytes: 64n * 2n ** 30n,
      memoryUsableRatio: 0.5,
      cpu: [{ vendor: 'AuthenticAMD', model: 'EPYC 7402P', cores: 24, hardwareThreads: 48 }],
      blockDevice: [
        {
          deviceModel: 'Micron_7300',
          serialNumber: 'M1',
          wwn: Uint8Array.of(0x50, 0x00, 0xc5, 0x00),
          capacityBytes: 2n ** 40n,
          logicalBlockSizeBytes: 512,
          physicalBlockSizeBytes: 4096,
          protocol: BlockDevice_Protocol.NVME,
          criticalWarning: true,
          mediaErrors: 3n,
          availableSpareRatio: 0.25,
          usageRatio: 0.5,
        },
        { deviceModel: 'QEMU HARDDISK', capacityBytes: -1n, protocol: BlockDevice_Protocol.UNKNOWN, rotational: true },
      ],
      networkInterface: [{ mac: Uint8Array.of(0x52, 0x54, 0, 0x12, 0x34, 0x5), driver: 'ixgbe', linkUp: true }],
    });
    const report = decodeHardwareReport(agentHardwareReport(toBinary(NodeSchema, node), 'no SMBIOS'));
    expect(report).toEqual({
      system: { manufacturer: 'Supermicro', product: 'SYS-1029P-WTR', serialNumber: 'S12345' },
      boot: 'BIOS',
      efiSupport: 'supported',
      memory: { installedBytes: 64 * 2 ** 30, usableRatio: 0.5 },
      cpus: [{ vendor: 'AuthenticAMD', model: 'EPYC 7402P', cores: 24, threads: 48 }],
      disks: [
        {
          vendor: '',
          model: 'Micron_7300',
          serialNumber: 'M1',
          wwn: '0x5000c500',
          sizeBytes: 2 ** 40,
          logicalBlockSize: 512,
          physicalBlockSize: 4096,
          protocol: 'NVMe',
          rotational: false,
          health: { criticalWarning: true, mediaErrors: 3, availableSpareRatio: 0.25, usageRatio: 0.5 },
        },
        {
          vendor: '',
          model: 'QEMU HARDDISK',
          serialNumber: '',
          wwn: '',
          sizeBytes: 0,
          logicalBlockSize: 0,
          physicalBlockSize: 0,
          protocol: 'unknown',
          rotational: true,
          health: { criticalWarning: false },
        },
      ],
      nics: [{ mac: '52:54:00:12:34:05', driver: 'ixgbe', linkUp: true, speedBytesPerSecond: 0 }],
      warnings: ['no SMBIOS'],
    });
  });

  test("a Node sent in parts is merged as protobuf's parsers do", () => {
    const first = toBinary(
      NodeSchema,
      create(NodeSchema, { manufacturer: 'Dell Inc.', cpu: [{ hardwareThreads: 8 }] }),
    );
    const second = toBinary(NodeSchema, create(NodeSchema, { product: 'R640', cpu: [{ hardwareThreads: 16 }] }));
    const writer = new BinaryWriter().tag(1, WireType.LengthDelimited).bytes(first);
    const report = decodeHardwareReport(writer.tag(1, WireType.LengthDelimited).bytes(second).finish());
    expect(report.system).toEqual({ manufacturer: 'Dell Inc.', product: 'R640', serialNumber: '' });
    expect(report.cpus.map((cpu) => cpu.threads)).toEqual([8, 16]);
  });

  test('bytes that are no report are shown as unreadable, with why, not thrown', () => {
    const at = new Date('2026-11-26T00:00:00Z');
    const hardware = machineHardware(Uint8Array.of(0x0a, 0x05, 0x01), at);
    expect(hardware.report).toBeUndefined();
    expect(hardware.reportedAt).toBe(at);
    expect(hardware.unreadable).toMatch(/^the stored hardware report is not one: /);
  });
});
