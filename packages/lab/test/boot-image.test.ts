/**
 * The image the lab installs (`buildBootImage`) is bootable under both
 * firmwares: a GPT whose one partition is an EFI system partition marked
 * legacy BIOS bootable, holding `\EFI\BOOT\BOOTX64.EFI` and SYSLINUX, with
 * SYSLINUX's GPT MBR in front; the agent's installer finds that partition;
 * and QEMU (TCG) boots it from a virtio disk under SeaBIOS and under OVMF,
 * the image's init saying which (under UEFI, with BootCurrent's entry).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { copyFile, mkdir, mkdtemp, open, readFile, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { eventually } from '../../../test/support/wait.js';
import { addBootEntryForDisk, EFI_GLOBAL_VARIABLE } from '../../agent/src/install/efi-boot.js';
import { type BootImage, buildBootImage, findKernel } from '../src/index.js';
import { missingForLab } from './support.js';

const missing = await missingForLab();
if (missing.length > 0) {
  console.warn(`boot image test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
}

const ESP_TYPE = 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B';
const run = promisify(execFile);
/** mtools on the partition at 1 MiB; it checks no geometry there. */
const MTOOLS_ENV = { ...process.env, MTOOLS_SKIP_CHECK: '1' };

describe.skipIf(missing.length > 0)('the installed image', () => {
  let dir: string;
  let image: BootImage;
  const vms = new Set<ChildProcess>();

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'lab-boot-image-'));
    image = await buildBootImage(dir, findKernel(), 'test');
  }, 120_000);
  afterAll(async () => {
    for (const vm of vms) vm.kill('SIGKILL');
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('is a GPT whose EFI system partition, legacy BIOS bootable, holds BOOTX64.EFI, the kernel and SYSLINUX', async () => {
    const { stdout } = await run('sfdisk', ['--json', image.path]);
    const table = JSON.parse(stdout).partitiontable;
    expect(table.label).toBe('gpt');
    expect(table.partitions).toHaveLength(1);
    const [esp] = table.partitions;
    expect(esp.type).toBe(ESP_TYPE);
    expect(esp.start).toBe(2048);
    expect(esp.attrs).toContain('LegacyBIOSBootable');
    const at = `${image.path}@@${esp.start * 512}`;
    // -a: SYSLINUX's files are hidden.
    const listing = async (where: string) =>
      (await run('mdir', ['-a', '-b', '-i', at, where], { env: MTOOLS_ENV })).stdout.split('\n').filter(Boolean);
    expect(await listing('::/EFI/BOOT')).toEqual(['::/EFI/BOOT/BOOTX64.EFI']);
    expect(await listing('::/')).toEqual(
      expect.arrayContaining(['::/vmlinuz', '::/initrd', '::/syslinux.cfg', '::/ldlinux.sys', '::/ldlinux.c32']),
    );
    // The loader is an x86-64 PE image: "MZ", and at the PE header the machine 0x8664.
    const loader = path.join(dir, 'loader.efi');
    await run('mcopy', ['-i', at, '::/EFI/BOOT/BOOTX64.EFI', loader], { env: MTOOLS_ENV });
    const pe = await readFile(loader);
    expect(pe.subarray(0, 2).toString('latin1')).toBe('MZ');
    const header = pe.readUInt32LE(0x3c);
    expect(pe.subarray(header, header + 4).toString('latin1')).toBe('PE\0\0');
    expect(pe.readUInt16LE(header + 4)).toBe(0x8664);
    // In front, SYSLINUX's GPT MBR code, and the protective MBR's one partition (type 0xEE).
    const handle = await open(image.path, 'r');
    const mbr = Buffer.alloc(512);
    await handle.read(mbr, 0, 512, 0);
    await handle.close();
    expect(mbr.subarray(0, 440).equals(await readFile('/usr/lib/syslinux/mbr/gptmbr.bin'))).toBe(true);
    expect(mbr[0x1c2]).toBe(0xee);
    expect(mbr.readUInt16LE(510)).toBe(0xaa55);
  });

  test("the agent's installer finds its EFI system partition and writes a boot entry for its loader", async () => {
    // efivarfs as a directory: the agent writes each variable as one file, its attributes first.
    const efivars = path.join(dir, 'efivars');
    await mkdir(efivars);
    const number = await addBootEntryForDisk(efivars, image.path, 512, 'BMaaS installed OS (test)');
    const entry = await readFile(
      path.join(efivars, `Boot${number.toString(16).padStart(4, '0')}-${EFI_GLOBAL_VARIABLE}`),
    );
    const description = entry.subarray(10, 10 + 2 * 'BMaaS installed OS (test)'.length).toString('utf16le');
    expect(description).toBe('BMaaS installed OS (test)');
    // Its device path: the hard drive node of partition 1, from LBA 2048.
    const node = entry.subarray(10 + 2 * (description.length + 1));
    expect([node[0], node[1]]).toEqual([0x04, 0x01]);
    expect(node.readUInt32LE(4)).toBe(1);
    expect(node.readBigUInt64LE(8)).toBe(2048n);
    expect(entry.toString('utf16le')).toContain('\\EFI\\BOOT\\BOOTX64.EFI');
  });

  test.each([
    ['SeaBIOS', [], / under BIOS, boot ID /],
    [
      'OVMF',
      [
        '-drive',
        'if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE.fd',
        '-drive',
        'if=pflash,format=raw,file=VARS',
      ],
      // No entry of the agent's in a fresh NVRAM: OVMF's own for the disk boots its removable-media loader.
      / under UEFI, BootCurrent Boot[0-9A-F]{4} "UEFI [^"]+", boot ID /,
    ],
  ] as const)(
    'boots from a virtio disk under %s and says so',
    async (firmware, args, how) => {
      const disk = path.join(dir, `${firmware}.img`);
      const vars = path.join(dir, `${firmware}-vars.fd`);
      await copyFile(image.path, disk);
      await copyFile('/usr/share/OVMF/OVMF_VARS.fd', vars);
      const serial = path.join(dir, `${firmware}.serial`);
      const started = performance.now();
      const vm = spawn(
        'qemu-system-x86_64',
        [
          '-accel',
          'tcg',
          '-nodefaults',
          '-display',
          'none',
          '-m',
          '512',
          ...args.map((arg) => arg.replace('VARS', vars)),
          '-drive',
          `file=${disk},format=raw,if=virtio`,
          '-serial',
          `file:${serial}`,
        ],
        { stdio: 'ignore' },
      );
      vms.add(vm);
      try {
        const line = await eventually(
          `the image booted under ${firmware}`,
          async () =>
            (await readFile(serial, 'utf8').catch(() => '')).split(/[\r\n]+/).find((l) => l.startsWith(image.bootLine)),
          240_000,
          500,
        );
        console.log(
          `boot image: ${firmware} to the image's init: ${((performance.now() - started) / 1000).toFixed(1)} s (load ${loadavg()[0]?.toFixed(2)})`,
        );
        expect(line).toMatch(how);
      } finally {
        vm.kill('SIGKILL');
        vms.delete(vm);
      }
    },
    300_000,
  );
});
