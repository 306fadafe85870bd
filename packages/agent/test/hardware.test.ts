import { cp, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BlockDevice_Protocol, EFISupport } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { afterAll, describe, expect, test } from 'vitest';
import { readControllers } from '../src/hardware/controllers.js';
import { readCpus } from '../src/hardware/cpu.js';
import { readDisks } from '../src/hardware/disks.js';
import { hardwareNode, readHardware } from '../src/hardware/inventory.js';
import { readMemory } from '../src/hardware/memory.js';
import { readNics } from '../src/hardware/nics.js';
import { parseSmbiosTable, SmbiosError, smbiosMemoryModules } from '../src/hardware/smbios.js';
import { readSmbios, readSystem } from '../src/hardware/system.js';
import { biosInformation, endOfTable, memoryDevice, smbiosStructure, systemInformation } from './smbios-builder.js';

const fixtures = fileURLToPath(new URL('./fixtures/', import.meta.url));
const GiB = 2 ** 30;
const scratch: string[] = [];
afterAll(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

/** The two-socket server's tree with its SMBIOS table: 12 DIMMs of 16 GiB, 12 empty slots, an NVDIMM. */
async function twoSocketServer(): Promise<string> {
  const root = await mkdtemp(path.join(tmpdir(), 'agent-hw-'));
  scratch.push(root);
  await cp(path.join(fixtures, 'two-socket-server'), root, { recursive: true, verbatimSymlinks: true });
  const dimms = Array.from({ length: 24 }, (_, i) => memoryDevice(0x1100 + i, i % 2 === 0 ? 16384 : 0));
  const table = Buffer.concat([
    biosInformation(true),
    systemInformation('Dell Inc.', 'PowerEdge R640', '7XQ2K93'),
    ...dimms,
    // An NVDIMM (memory technology 0x04, NVDIMM-N): not memory the OS runs in.
    memoryDevice(0x1200, 16384, { technology: 0x04 }),
    endOfTable(),
  ]);
  await mkdir(path.join(root, 'sys/firmware/dmi/tables'), { recursive: true });
  await writeFile(path.join(root, 'sys/firmware/dmi/tables/DMI'), table);
  return root;
}

describe('SMBIOS', () => {
  test('reads the strings of each structure, and module sizes in MiB, KiB and the extended size', () => {
    const table = Buffer.concat([
      systemInformation('Supermicro', 'SYS-1029P-WTR', 'S12345'),
      memoryDevice(1, 8192),
      memoryDevice(2, 0x8000 | 16384), // 16 MiB in KiB
      memoryDevice(3, 0x7fff, { extendedMiB: 65536 }), // 64 GiB
      memoryDevice(4, 0xffff), // unknown size
      memoryDevice(5, 0),
      endOfTable(),
      // Past the end-of-table structure: not read.
      memoryDevice(6, 4096),
    ]);
    const structures = parseSmbiosTable(table);
    expect(structures.map((s) => s.type)).toEqual([1, 17, 17, 17, 17, 17, 127]);
    expect(structures[0]?.strings).toEqual(['Supermicro', 'SYS-1029P-WTR', 'S12345']);
    expect(smbiosMemoryModules(structures)).toEqual([8 * GiB, 16 * 2 ** 20, 64 * GiB]);
  });

  test('a structure whose length runs past the table is an SmbiosError naming where', () => {
    const broken = smbiosStructure(1, 1, Buffer.alloc(10));
    broken[1] = 200;
    expect(() => parseSmbiosTable(broken)).toThrow(SmbiosError);
    expect(() => parseSmbiosTable(broken)).toThrow(/type 1 at byte 0 has length 200/);
  });
});

describe('a two-socket server: NVMe, SATA and SAS disks, four NICs, two in a bond, UEFI', () => {
  test('system: DMI names from SMBIOS, booted by UEFI with runtime services', async () => {
    const root = await twoSocketServer();
    const smbios = await readSmbios(root, []);
    expect(await readSystem(root, smbios)).toEqual({
      manufacturer: 'Dell Inc.',
      product: 'PowerEdge R640',
      serialNumber: '7XQ2K93',
      bootMode: 'uefi',
      efiSupport: 'enabled',
    });
  });

  test('memory: the 12 DRAM modules installed (not the NVDIMM), MemTotal usable', async () => {
    const root = await twoSocketServer();
    const memory = await readMemory(root, await readSmbios(root, []), []);
    expect(memory).toEqual({
      installedBytes: 12 * 16 * GiB,
      installedFrom: 'smbios',
      moduleBytes: Array(12).fill(16 * GiB),
      usableBytes: 196438172 * 1024,
    });
  });

  test('CPUs: one record per socket, 16 cores and 32 threads each', async () => {
    const cpus = await readCpus(path.join(fixtures, 'two-socket-server'), []);
    const socket = {
      vendor: 'GenuineIntel',
      model: 'Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz',
      x86: { family: 6, model: 85, stepping: 4 },
      cores: 16,
      threads: 32,
    };
    expect(cpus).toEqual([
      { socket: 0, ...socket },
      { socket: 1, ...socket },
    ]);
  });

  test('disks: every whole disk with its identity, sizes, protocol, by-path links and health; no partitions, loop, sr, dm', async () => {
    const disks = await readDisks(path.join(fixtures, 'two-socket-server'), []);
    expect(disks).toEqual([
      {
        name: 'nvme0n1',
        path: '/dev/nvme0n1',
        protocol: 'nvme',
        vendor: '',
        model: 'SAMSUNG MZQLB960HAJR-00007',
        serialNumber: 'S437NA0M512345',
        wwn: '0x0025385b71b0fa2e',
        rotational: false,
        sizeBytes: 1875385008 * 512,
        logicalBlockSize: 512,
        physicalBlockSize: 512,
        byPath: ['/dev/disk/by-path/pci-0000:3b:00.0-nvme-1'],
        health: { criticalWarning: false },
      },
      {
        name: 'sda',
        path: '/dev/sda',
        protocol: 'ata',
        vendor: '',
        model: 'INTEL SSDSC2KB48',
        serialNumber: 'BTYF01234567480BGN',
        wwn: '0x55cd2e414f8a1b2c',
        rotational: false,
        sizeBytes: 937703088 * 512,
        logicalBlockSize: 512,
        physicalBlockSize: 4096,
        byPath: ['/dev/disk/by-path/pci-0000:00:17.0-ata-1'],
        health: {},
      },
      {
        name: 'sdb',
        path: '/dev/sdb',
        protocol: 'scsi',
        vendor: 'SEAGATE',
        model: 'ST2000NM0135',
        serialNumber: 'ZC20ABCD0000C8123456',
        wwn: '0x5000c500a1b2c3d4',
        rotational: true,
        sizeBytes: 3907029168 * 512,
        logicalBlockSize: 512,
        physicalBlockSize: 512,
        byPath: ['/dev/disk/by-path/pci-0000:18:00.0-sas-phy0-lun-0'],
        health: {},
      },
    ]);
  });

  test("an NVMe controller's raised temperature alarm is its critical warning", async () => {
    const root = await twoSocketServer();
    await writeFile(path.join(root, 'sys/class/block/nvme0n1/device/hwmon/hwmon2/temp1_alarm'), '1\n');
    const disks = await readDisks(root, []);
    expect(disks.map((disk) => [disk.name, disk.health])).toEqual([
      ['nvme0n1', { criticalWarning: true }],
      ['sda', {}],
      ['sdb', {}],
    ]);
    expect(hardwareNode({ ...(await readHardware(root)) }).blockDevice[0]?.criticalWarning).toBe(true);
  });

  test('NICs: the physical ones, a bond member by its permanent MAC, speed only with a link', async () => {
    const nics = await readNics(path.join(fixtures, 'two-socket-server'));
    expect(nics).toEqual([
      { name: 'eno1', mac: 'b0:26:28:1a:2b:3c', driver: 'bnxt_en', linkUp: true, speedMbps: 25000, bond: 'bond0' },
      { name: 'eno2', mac: 'b0:26:28:1a:2b:3d', driver: 'bnxt_en', linkUp: true, speedMbps: 25000, bond: 'bond0' },
      { name: 'eno3', mac: 'b0:26:28:1a:2b:3e', driver: 'igb', linkUp: true, speedMbps: 1000 },
      { name: 'eno4', mac: 'b0:26:28:1a:2b:3f', driver: 'igb', linkUp: false },
    ]);
  });

  test('the hardware report Node carries all of it, as upstream names and numbers its fields', async () => {
    const inventory = await readHardware(await twoSocketServer());
    expect(inventory.warnings).toEqual([]);
    const node = hardwareNode(inventory);
    expect(node.manufacturer).toBe('Dell Inc.');
    expect(node.serialNumber).toBe('7XQ2K93');
    expect(node.efiSupport).toBe(EFISupport.EFI_SUPPORT_ENABLED);
    expect(node.memoryInstalledBytes).toBe(BigInt(192 * GiB));
    expect(node.memoryUsableRatio).toBeCloseTo(196438172 / (192 * 2 ** 20), 5);
    expect(node.cpu.map((cpu) => [cpu.cores, cpu.hardwareThreads, cpu.architecture.case])).toEqual([
      [16, 32, 'x8664'],
      [16, 32, 'x8664'],
    ]);
    expect(node.blockDevice.map((disk) => [disk.protocol, Buffer.from(disk.wwn).toString('hex')])).toEqual([
      [BlockDevice_Protocol.NVME, '0025385b71b0fa2e'],
      [BlockDevice_Protocol.ATA, '55cd2e414f8a1b2c'],
      [BlockDevice_Protocol.SCSI, '5000c500a1b2c3d4'],
    ]);
    expect(node.networkInterface.map((nic) => [Buffer.from(nic.mac).toString('hex'), nic.currentSpeedBytes])).toEqual([
      ['b026281a2b3c', 25_000n * 125_000n],
      ['b026281a2b3d', 25_000n * 125_000n],
      ['b026281a2b3e', 1_000n * 125_000n],
      ['b026281a2b3f', 0n],
    ]);
  });
});

describe('a VM booted by BIOS, read without privileges: no SMBIOS table, virtio and eMMC disks', () => {
  const root = path.join(fixtures, 'bios-vm');

  test('DMI names from /sys/class/dmi/id, BIOS boot, EFI support unknown, and a warning saying why', async () => {
    const warnings: string[] = [];
    const smbios = await readSmbios(root, warnings);
    expect(smbios).toBeUndefined();
    expect(warnings).toEqual([expect.stringMatching(/^SMBIOS table \/sys\/firmware\/dmi\/tables\/DMI unreadable/)]);
    expect(await readSystem(root, smbios)).toEqual({
      manufacturer: 'QEMU',
      product: 'Standard PC (i440FX + PIIX, 1996)',
      serialNumber: '',
      bootMode: 'bios',
      efiSupport: 'unknown',
    });
  });

  test('memory installed from the online sysfs memory blocks (upstream counts none), usable from meminfo', async () => {
    // 65 online blocks of 128 MiB, one offline.
    expect(await readMemory(root, undefined, [])).toEqual({
      installedBytes: 65 * 128 * 2 ** 20,
      installedFrom: 'sysfs',
      moduleBytes: [],
      usableBytes: 8130548 * 1024,
    });
  });

  test('disks: the eMMC (not its boot partitions or partitions) and the virtio disk', async () => {
    const disks = await readDisks(root, []);
    expect(disks.map((d) => [d.name, d.protocol, d.model, d.serialNumber, d.sizeBytes, d.rotational])).toEqual([
      ['mmcblk0', 'mmc', 'DG4016', '0x1b2c3d4e', 30535680 * 512, false],
      ['vda', 'virtio', '', 'vm-disk-1', 20 * GiB, true],
    ]);
  });

  test('NICs: the virtio NIC, its speed unknown', async () => {
    expect(await readNics(root)).toEqual([
      { name: 'ens3', mac: '52:54:00:12:34:56', driver: 'virtio_net', linkUp: true },
    ]);
  });

  test('CPUs: one socket of 4 cores and 4 threads', async () => {
    expect((await readCpus(root, [])).map((cpu) => [cpu.vendor, cpu.cores, cpu.threads, cpu.x86?.family])).toEqual([
      ['AuthenticAMD', 4, 4, 25],
    ]);
  });
});

describe('NVMe under native multipath: a namespace whose device is its subsystem, not a controller', () => {
  async function multipathServer(): Promise<string> {
    const root = await mkdtemp(path.join(tmpdir(), 'agent-nvme-'));
    scratch.push(root);
    await cp(path.join(fixtures, 'nvme-multipath'), root, { recursive: true, verbatimSymlinks: true });
    return root;
  }
  const controllerAlarm = (root: string, controller: string, hwmon: string) =>
    path.join(root, `sys/class/block/nvme0n1/device/${controller}/hwmon/${hwmon}/temp1_alarm`);

  test("the identity from the subsystem, the health from its controllers' alarms; its paths are no disks", async () => {
    const disks = await readDisks(path.join(fixtures, 'nvme-multipath'), []);
    expect(disks.map((d) => [d.name, d.protocol, d.model, d.serialNumber, d.wwn])).toEqual([
      ['nvme0n1', 'nvme', 'SAMSUNG MZWLR3T8HBLS-00007', 'S6EXNE0R600123', '0x36344730526059940025384500000001'],
      ['nvme1n1', 'nvme', 'SAMSUNG MZQLB960HAJR-00007', 'S437NA0M598765', ''],
    ]);
    expect(disks[0]?.health).toEqual({ criticalWarning: false });
  });

  test.each([
    ['nvme0', 'hwmon1'],
    ['nvme1', 'hwmon3'],
  ])("a raised temperature alarm of controller %s is the namespace's critical warning", async (controller, hwmon) => {
    const root = await multipathServer();
    await writeFile(controllerAlarm(root, controller, hwmon), '1\n');
    const inventory = await readHardware(root);
    expect(inventory.disks.find((d) => d.name === 'nvme0n1')?.health).toEqual({ criticalWarning: true });
    expect(hardwareNode(inventory).blockDevice[0]?.criticalWarning).toBe(true);
  });

  test('a subsystem whose controllers have no hwmon: its health is unknown, not good, and a warning says so', async () => {
    const warnings: string[] = [];
    const disks = await readDisks(path.join(fixtures, 'nvme-multipath'), warnings);
    expect(disks.find((d) => d.name === 'nvme1n1')?.health).toEqual({});
    expect(warnings).toEqual([
      "disk nvme1n1: no controller of it has an NVMe temperature alarm (hwmon): its health is unknown, reported as no critical warning (the report's critical_warning cannot say unknown)",
    ]);
  });
});

describe('a server whose storage and network controllers have no driver (fixture old-image-r740)', () => {
  const root = path.join(fixtures, 'old-image-r740');

  test('its PCI storage and network controllers, each with the driver bound or none; bridges and others left out', async () => {
    expect(await readControllers(root)).toEqual([
      { address: '0000:00:17.0', kind: 'storage', pciId: '8086:a182', pciClass: '0106', driver: 'ahci' },
      { address: '0000:04:00.0', kind: 'network', pciId: '14e4:165f', pciClass: '0200', driver: 'tg3' },
      { address: '0000:04:00.1', kind: 'network', pciId: '14e4:165f', pciClass: '0200', driver: 'tg3' },
      { address: '0000:18:00.0', kind: 'storage', pciId: '1000:005d', pciClass: '0104', driver: '' },
      { address: '0000:3b:00.0', kind: 'network', pciId: '15b3:1017', pciClass: '0200', driver: '' },
      { address: '0000:3b:00.1', kind: 'network', pciId: '15b3:1017', pciClass: '0200', driver: '' },
      { address: '0000:5d:05.5', kind: 'storage', pciId: '8086:201d', pciClass: '0104', driver: '' },
    ]);
  });

  test('each controller without a driver is a warning of the report naming it: its disks or NICs are not seen', async () => {
    const inventory = await readHardware(root);
    expect(inventory.disks.map((disk) => disk.serialNumber)).toEqual(['2029E1234567']);
    expect(inventory.nics.map((nic) => nic.name)).toEqual(['eno1', 'eno2']);
    const driverless = [
      'storage controller 0000:18:00.0 (PCI ID 1000:005d, class 0104) has no driver bound: the disks behind it are not seen',
      'network controller 0000:3b:00.0 (PCI ID 15b3:1017, class 0200) has no driver bound: its NICs are not seen',
      'network controller 0000:3b:00.1 (PCI ID 15b3:1017, class 0200) has no driver bound: its NICs are not seen',
      'storage controller 0000:5d:05.5 (PCI ID 8086:201d, class 0104) has no driver bound: the disks behind it are not seen',
    ];
    // The fixture has no DMI, memory or CPU files: their warnings come first.
    expect(inventory.warnings.slice(-4)).toEqual(driverless);
    expect(inventory.warnings.filter((w) => w.includes('controller'))).toEqual(driverless);
  });
});
