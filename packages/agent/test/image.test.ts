/**
 * The agent image built from this machine's Debian packages: an initramfs
 * holding /init, busybox, node and the agent bundle, the kernel's NIC and
 * storage drivers with the indexes its modprobe resolves a device's modalias
 * through, and the firmware they declare that a (fake) firmware directory
 * has; an ISO booting it under BIOS and UEFI; a second build served from the
 * cache; one machine's config as an initramfs of its own, and in a copy of
 * the ISO. (That it boots, and loads a RAID controller's driver, is
 * packages/lab/test/agent-image.test.ts.)
 */
import { execFile } from 'node:child_process';
import { createHash, generateKeyPairSync } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { create } from '@bufbuild/protobuf';
import { afterAll, beforeAll, expect, test } from 'vitest';
import {
  type AgentImage,
  AgentImageError,
  agentConfigArchive,
  buildAgentImage,
  configureAgentIso,
  findKernel,
} from '../src/index.js';
import { bundleAgent } from './bundle-agent.js';

const run = promisify(execFile);
/** Shared between runs, so a rerun finds the image built. */
const cacheDir = path.join(tmpdir(), 'bmaas-agent-image-test-cache');

let dir: string;
let image: AgentImage;
/** The build's firmware directory: two files bnx2x and qed declare, one of them xz-compressed. */
let firmwareDir: string;
let bnx2xFirmware: string[];
let qedFirmware: string[];

/** What `modinfo` (kmod, not the build's own reading) says the kernel's modules declare. */
async function modinfoFirmware(release: string, modules: readonly string[]): Promise<string[]> {
  const { stdout } = await run('modinfo', ['-k', release, '-F', 'firmware', ...modules], { maxBuffer: 16 * 2 ** 20 });
  return stdout.split('\n').filter((line) => line !== '');
}

/** The module names a device's modalias resolves to through a modules.alias (its patterns are fnmatch's). */
function resolveAlias(aliasFile: string, modalias: string): string[] {
  const matches = new Set<string>();
  for (const line of aliasFile.split('\n')) {
    const [word, pattern, module] = line.split(' ');
    if (word !== 'alias' || pattern === undefined || module === undefined) continue;
    const regex = pattern
      .replace(/[.+^${}()|\\]/g, '\\$&')
      .replace(/\*/g, '.*')
      .replace(/\?/g, '.');
    if (new RegExp(`^${regex}$`).test(modalias)) matches.add(module);
  }
  return [...matches].sort();
}

/** The paths in a newc cpio archive (busybox's cpio reads it). */
async function cpioPaths(archive: string): Promise<string[]> {
  const { stdout } = await run(
    'sh',
    ['-c', `${archive.endsWith('.cpio') ? 'cat' : 'busybox gunzip -c'} "$1" | busybox cpio -t`, 'sh', archive],
    {
      maxBuffer: 64 * 2 ** 20,
    },
  );
  return stdout.split('\n').filter((line) => line !== '');
}

async function isoPaths(iso: string): Promise<string[]> {
  const { stdout } = await run('xorriso', ['-indev', iso, '-find', '/', '-type', 'f']);
  return stdout
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => line.replace(/^'|'$/g, ''));
}

/** Large files are compared by hash: expect's deep equality walks a Buffer byte by byte. */
async function sha256(file: string): Promise<string> {
  return createHash('sha256')
    .update(await readFile(file))
    .digest('hex');
}

async function extract(iso: string, file: string, to: string): Promise<string> {
  await run('xorriso', ['-osirrox', 'on', '-indev', iso, '-extract', file, to]);
  return to;
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-image-'));
  const bundle = path.join(dir, 'agent.cjs');
  await bundleAgent(bundle);
  const release = findKernel().release;
  bnx2xFirmware = await modinfoFirmware(release, ['bnx2x']);
  qedFirmware = await modinfoFirmware(release, ['qed']);
  firmwareDir = path.join(dir, 'firmware');
  for (const [name, data] of [
    [bnx2xFirmware[0], 'bnx2x firmware'],
    [`${qedFirmware[0]}.xz`, 'qed firmware, xz-compressed'],
  ] as const) {
    await mkdir(path.dirname(path.join(firmwareDir, name as string)), { recursive: true });
    await writeFile(path.join(firmwareDir, name as string), data);
  }
  image = await buildAgentImage({ out: path.join(dir, 'out'), cacheDir, agentBundle: bundle, firmwareDir });
}, 300_000);

afterAll(() => rm(dir, { recursive: true, force: true }));

test('the initramfs unpacks, holding /init, busybox, node with its libraries, the agent and the disk and NIC drivers', async () => {
  const paths = await cpioPaths(image.initramfs);
  const release = image.kernel.release;
  for (const expected of [
    'init',
    'bin/busybox',
    'bin/sh',
    'bin/udhcpc',
    'usr/bin/node',
    'usr/sbin/kexec',
    // The decompressors of xz and zstd images, with their libraries.
    'usr/bin/xz',
    'usr/bin/zstd',
    'lib/x86_64-linux-gnu/liblzma.so.5',
    'lib/x86_64-linux-gnu/liblz4.so.1',
    'lib64/ld-linux-x86-64.so.2',
    'lib/x86_64-linux-gnu/libstdc++.so.6',
    'opt/bmaas/agent.cjs',
    'sbin/modprobe',
    `lib/modules/${release}/modules.dep`,
    `lib/modules/${release}/modules.alias`,
    'etc/bmaas/udhcpc.script',
    'etc/bmaas/dhcp-on-link',
    `lib/modules/${release}/kernel/drivers/block/virtio_blk.ko`,
    `lib/modules/${release}/kernel/drivers/nvme/host/nvme.ko`,
    `lib/modules/${release}/kernel/drivers/ata/ahci.ko`,
    `lib/modules/${release}/kernel/drivers/net/virtio_net.ko`,
    `lib/modules/${release}/kernel/drivers/net/ethernet/intel/e1000/e1000.ko`,
  ]) {
    expect(paths).toContain(expected);
  }
  // Debian's xz, found first on the PATH (/bin comes before /usr/bin), not busybox's applet.
  expect(paths).not.toContain('bin/xz');
  // Nothing machine-specific: the handover comes with the boot.
  expect(paths).not.toContain('etc/bmaas/handover.json');
  expect(image.initramfsBytes).toBeLessThan(128 * 2 ** 20);
});

/** Devices of Dell, HPE, Lenovo and Supermicro servers, by the modalias their PCI device has, and the driver each needs. */
const SERVER_DEVICES = [
  ['Mellanox ConnectX-4', 'pci:v000015B3d00001013sv000015B3sd00000003bc02sc00i00', 'mlx5_core'],
  ['Mellanox ConnectX-5', 'pci:v000015B3d00001017sv000015B3sd00000007bc02sc00i00', 'mlx5_core'],
  ['Mellanox ConnectX-6', 'pci:v000015B3d0000101Bsv000015B3sd00000008bc02sc00i00', 'mlx5_core'],
  ['Intel E810-C', 'pci:v00008086d00001592sv00008086sd00000002bc02sc00i00', 'ice'],
  ['Intel E810-XXV', 'pci:v00008086d0000159Bsv00008086sd00000003bc02sc00i00', 'ice'],
  ['Broadcom BCM57810', 'pci:v000014E4d0000168Esv0000103Csd00001917bc02sc00i00', 'bnx2x'],
  ['QLogic FastLinQ QL41000', 'pci:v00001077d00008070sv00001077sd00000001bc02sc00i00', 'qede'],
  ['Dell PERC H730P (LSI SAS3108)', 'pci:v00001000d0000005Dsv00001028sd00001F47bc01sc04i00', 'megaraid_sas'],
  ['Broadcom SAS3008 HBA', 'pci:v00001000d00000097sv00001000sd00003090bc01sc07i00', 'mpt3sas'],
  ['HPE Smart Array P408i', 'pci:v00009005d0000028Fsv0000103Csd00000600bc01sc07i00', 'smartpqi'],
  ['HPE Smart Array P440ar', 'pci:v0000103Cd00003239sv0000103Csd000021C0bc01sc04i00', 'hpsa'],
  ['Intel VMD', 'pci:v00008086d0000201Dsv00001028sd00000716bc01sc04i00', 'vmd'],
  ['QEMU megasas-gen2 (LSI SAS2108)', 'pci:v00001000d00000079sv00001000sd00009261bc01sc04i00', 'megaraid_sas'],
] as const;

test.each(SERVER_DEVICES)(
  '%s: the kernel’s modules.alias names its driver, which the image carries and its modules.alias resolves',
  async (_device, modalias, driver) => {
    const kernel = findKernel();
    expect(resolveAlias(await readFile(path.join(kernel.modules, 'modules.alias'), 'utf8'), modalias)).toContain(
      driver,
    );
    const unpacked = await unpackedImage();
    const imageModules = path.join(unpacked, 'lib/modules', kernel.release);
    expect(resolveAlias(await readFile(path.join(imageModules, 'modules.alias'), 'utf8'), modalias)).toContain(driver);
    // Its file and every dependency modules.dep names are in the image.
    const dep = (await readFile(path.join(imageModules, 'modules.dep'), 'utf8'))
      .split('\n')
      .find((line) => path.basename(line.split(':')[0] ?? '').replace(/-/g, '_') === `${driver}.ko`);
    expect(dep, driver).toBeDefined();
    for (const file of (dep as string)
      .replace(':', '')
      .split(' ')
      .filter((f) => f !== '')) {
      expect((await stat(path.join(imageModules, file))).size, file).toBeGreaterThan(0);
    }
  },
);

let unpacking: Promise<string> | undefined;
/** The initramfs unpacked once (busybox's cpio), for the files in it. */
function unpackedImage(): Promise<string> {
  unpacking ??= (async () => {
    const to = path.join(dir, 'unpacked');
    await mkdir(to);
    await run('sh', [
      '-c',
      'busybox gunzip -c "$1" | (cd "$2" && busybox cpio -i -d 2>/dev/null)',
      'sh',
      image.initramfs,
      to,
    ]);
    return to;
  })();
  return unpacking;
}

// The image's own modprobe (busybox's) resolving a device's modalias through the image's indexes, in a
// chroot of the unpacked image: it looks under /lib/modules/<running kernel>, so that is a link to the image's.
const chrootable = process.getuid?.() === 0;
if (!chrootable) console.warn('agent image: the test of its modprobe in a chroot is skipped: it needs root');
test.skipIf(!chrootable)(
  'the image’s modprobe resolves each server device to its driver, after what it needs',
  async () => {
    const unpacked = await unpackedImage();
    const running = (await run('uname', ['-r'])).stdout.trim();
    if (running !== image.kernel.release) {
      await symlink(image.kernel.release, path.join(unpacked, 'lib/modules', running)).catch(() => undefined);
    }
    for (const [device, modalias, driver] of SERVER_DEVICES) {
      const { stdout } = await run('chroot', [unpacked, '/bin/busybox', 'modprobe', '-D', modalias]);
      const loads = stdout.split('\n').filter((line) => line.startsWith('insmod '));
      expect(loads.at(-1), device).toMatch(new RegExp(`/${driver}\\.ko\\s*$`));
    }
  },
);

test('the firmware the drivers declare: found in the firmware directory, in the image; the rest listed as missing', async () => {
  const bnx2xFound = bnx2xFirmware[0] as string;
  const qedFound = `${qedFirmware[0]}.xz`;
  expect(image.firmwareDir).toBe(firmwareDir);
  expect(image.firmware).toEqual([bnx2xFound, qedFound].sort());
  const unpacked = await unpackedImage();
  expect(await readFile(path.join(unpacked, 'lib/firmware', bnx2xFound), 'utf8')).toBe('bnx2x firmware');
  expect(await readFile(path.join(unpacked, 'lib/firmware', qedFound), 'utf8')).toBe('qed firmware, xz-compressed');
  // Every other file bnx2x and qed declare is missing, named with its module.
  expect(image.missingFirmware.filter((m) => m.module === 'bnx2x').map((m) => m.firmware)).toEqual(
    bnx2xFirmware.slice(1),
  );
  expect(image.missingFirmware.filter((m) => m.module === 'qed').map((m) => m.firmware)).toEqual(qedFirmware.slice(1));
  // All the image's modules declare, as kmod's modinfo reads them: found or missing, nothing left out.
  const declared = await modinfoFirmware(
    image.kernel.release,
    image.modules.map((module) => path.join(image.kernel.modules, module)),
  );
  expect(declared.length).toBeGreaterThan(50);
  expect(
    [...new Set([...image.missingFirmware.map((m) => m.firmware), bnx2xFirmware[0], qedFirmware[0]])].sort(),
  ).toEqual([...new Set(declared)].sort());
});

test('the ISO holds the kernel, the initramfs, isolinux for BIOS and an EFI system partition for UEFI', async () => {
  expect(await isoPaths(image.iso)).toEqual(
    expect.arrayContaining([
      '/boot/vmlinuz',
      '/boot/initramfs',
      '/boot/config.cpio',
      '/boot/efiboot.img',
      '/isolinux/isolinux.bin',
      '/isolinux/ldlinux.c32',
      '/isolinux/isolinux.cfg',
    ]),
  );
  const { stdout } = await run('xorriso', ['-indev', image.iso, '-report_el_torito', 'plain']);
  expect(stdout).toMatch(/El Torito boot img :\s+1\s+BIOS\s+y/);
  expect(stdout).toMatch(/El Torito boot img :\s+2\s+UEFI\s+y/);
  expect(stdout).toMatch(/El Torito img path :\s+2\s+\/boot\/efiboot\.img/);
  const esp = await extract(image.iso, '/boot/efiboot.img', path.join(dir, 'efiboot.img'));
  const listing = await run('mdir', ['-b', '-i', esp, '::/EFI/BOOT'], {
    env: { ...process.env, MTOOLS_SKIP_CHECK: '1' },
  });
  expect(listing.stdout).toContain('BOOTX64.EFI');
  // The kernel is Debian's, as it is, and the generic ISO's config is an empty archive.
  expect(await sha256(await extract(image.iso, '/boot/vmlinuz', path.join(dir, 'vmlinuz')))).toBe(
    await sha256(findKernel().image),
  );
  expect(await cpioPaths(await extract(image.iso, '/boot/config.cpio', path.join(dir, 'generic.cpio')))).toEqual([]);
  expect(image.isoBytes).toBeLessThan(128 * 2 ** 20);
});

test('a second build with the same inputs comes from the cache, byte for byte, and older builds are removed from it', async () => {
  // Builds of other inputs: the newest other stays (another build may be reading it), older ones go.
  const older = path.join(cacheDir, 'initramfs-0000000000000000.gz');
  const newer = path.join(cacheDir, 'initramfs-1111111111111111.gz');
  await writeFile(older, 'older build');
  await writeFile(newer, 'newer build');
  await utimes(older, new Date(1000), new Date(1000));
  const again = await buildAgentImage({
    out: path.join(dir, 'again'),
    cacheDir,
    agentBundle: path.join(dir, 'agent.cjs'),
    firmwareDir,
  });
  expect(again.cached).toEqual({ initramfs: true, iso: true });
  expect(await sha256(again.initramfs)).toBe(await sha256(image.initramfs));
  await expect(stat(older)).rejects.toThrow(/ENOENT/);
  expect(await readFile(newer, 'utf8')).toBe('newer build');
  await rm(newer);
});

test('one machine’s config is an initramfs of its own, and in a copy of the ISO replaces the empty one', async () => {
  const { privateKey } = generateKeyPairSync('ed25519');
  const init = create(TakeoverInitSchema, { machineId: 'm-1', bmaasEndpoint: '10.0.2.2:4443' });
  const config = agentConfigArchive({
    init,
    privateKey,
    flags: ['--interval=2s'],
    network: { interface: '52:54:00:12:34:56', address: '10.0.2.15/24', gateway: '10.0.2.2', dns: ['10.0.2.3'] },
  });
  const configFile = path.join(dir, 'config.cpio');
  await writeFile(configFile, config);
  expect(await cpioPaths(configFile)).toEqual([
    'etc',
    'etc/bmaas',
    'etc/bmaas/handover.json',
    'etc/bmaas/agent-flags',
    'etc/bmaas/network',
  ]);
  const machineIso = path.join(dir, 'machine.iso');
  await configureAgentIso(image.iso, configFile, machineIso);
  expect(await readFile(await extract(machineIso, '/boot/config.cpio', path.join(dir, 'replayed.cpio')))).toEqual(
    config,
  );
  const { stdout } = await run('xorriso', ['-indev', machineIso, '-report_el_torito', 'plain']);
  expect(stdout).toMatch(/UEFI\s+y/);
  expect(stdout).toMatch(/BIOS\s+y/);
});

test('a network setting that is not an address is refused, naming the field', () => {
  const { privateKey } = generateKeyPairSync('ed25519');
  const init = create(TakeoverInitSchema, { machineId: 'm-1', bmaasEndpoint: '10.0.2.2:4443' });
  expect(() => agentConfigArchive({ init, privateKey, network: { address: '10.0.2.15; reboot' } })).toThrow(
    AgentImageError,
  );
  expect(() =>
    agentConfigArchive({ init, privateKey, network: { address: '10.0.2.15/24', gateway: '$(reboot)' } }),
  ).toThrow('network.gateway "$(reboot)": want an IP address');
  expect(() =>
    agentConfigArchive({ init, privateKey, network: { address: '10.0.2.15/24', interface: 'eth0;x' } }),
  ).toThrow('network.interface');
});
