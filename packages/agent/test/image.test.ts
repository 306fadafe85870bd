/**
 * The agent image built from this machine's Debian packages: an initramfs
 * holding /init, busybox, node and the agent bundle; an ISO booting it under
 * BIOS and UEFI; a second build served from the cache; one machine's config
 * as an initramfs of its own, and in a copy of the ISO. (That it boots is
 * packages/lab/test/agent-image.test.ts.)
 */
import { execFile } from 'node:child_process';
import { createHash, generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { create } from '@bufbuild/protobuf';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { TakeoverInitSchema } from '../src/gen/cloud/agent/api/takeover_pb.js';
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
  image = await buildAgentImage({ out: path.join(dir, 'out'), cacheDir, agentBundle: bundle });
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
    'etc/bmaas/modules',
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
