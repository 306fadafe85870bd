/**
 * The Debian 12 cloud image (`buildCloudImage`) is built from Debian's
 * packages and cached by its inputs, and boots, as operators' machines would
 * boot it, on the lab's blank VMs: from a disk behind a MegaRAID SAS
 * controller under SeaBIOS and from an NVMe disk under OVMF. cloud-init
 * reads a NoCloud seed the test writes as a partition at the disk's end (as
 * the shepherd's config drive sits): the host name, an SSH key for the image's
 * default user, user data; the test logs in with that key and finds them,
 * and the host key the OS presents is one cloud-init printed on the console.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { onPath } from '@bmaas/provider-static/testing';
import { type HostKeyPinStore, Ssh2Client, SshKey } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { freePort } from '../../../test/support/ports.js';
import { eventually } from '../../../test/support/wait.js';
import {
  buildCloudImage,
  buildInitramfs,
  CLOUD_IMAGE_CACHE,
  type CloudImage,
  findKernel,
  prepareGuestShare,
  VirtualMachine,
  type VmDiskController,
  type VmFirmware,
} from '../src/index.js';

const run = promisify(execFile);

/** What building and booting the image needs from Debian, by package. */
async function missingForCloudImage(): Promise<string[]> {
  const missing: string[] = [];
  for (const [program, pkg] of [
    ['qemu-system-x86_64', 'qemu-system-x86'],
    ['qemu-img', 'qemu-utils'],
    ['mmdebstrap', 'mmdebstrap'],
    ['sfdisk', 'fdisk'],
    ['mkfs.ext4', 'e2fsprogs'],
    ['mkfs.fat', 'dosfstools'],
    ['mcopy', 'mtools'],
    ['grub-mkimage', 'grub-common'],
  ] as const) {
    if (!(await onPath(program))) missing.push(pkg);
  }
  if (!existsSync('/usr/share/OVMF/OVMF_CODE.fd')) missing.push('ovmf');
  return missing;
}

const missing = await missingForCloudImage();
const root = process.getuid?.() === 0;
if (missing.length > 0) {
  console.warn(`cloud image test skipped: missing ${missing.join(', ')} (apt-get install -y ${missing.join(' ')})`);
} else if (!root) {
  console.warn('cloud image test skipped: building the image needs root (mmdebstrap --mode=root)');
}

const seconds = (since: number) => `${((performance.now() - since) / 1000).toFixed(1)} s`;
const load = () => `load ${loadavg()[0]?.toFixed(2)}`;

describe.skipIf(missing.length > 0 || !root)('the Debian 12 cloud image', () => {
  let dir: string;
  let image: CloudImage;
  const vms: VirtualMachine[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'lab-cloud-image-'));
    const started = performance.now();
    image = await buildCloudImage({ cacheDir: CLOUD_IMAGE_CACHE });
    console.log(
      `cloud image: ${image.cached ? 'from the cache' : 'built'} in ${seconds(started)} (${load()}), ${image.bytes} bytes`,
    );
  }, 900_000);
  afterAll(async () => {
    await Promise.all(vms.map((vm) => vm.stop()));
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('comes from its cache the second time, unchanged', async () => {
    const started = performance.now();
    const again = await buildCloudImage({ cacheDir: CLOUD_IMAGE_CACHE });
    console.log(`cloud image: cached in ${seconds(started)}`);
    expect(again).toEqual({ ...image, cached: true });
  });

  test('is a qcow2 of a GPT disk: a BIOS boot partition, an EFI system partition holding BOOTX64.EFI, the root', async () => {
    const info = JSON.parse((await run('qemu-img', ['info', '--output=json', image.path])).stdout);
    expect(info.format).toBe('qcow2');
    expect(info['virtual-size']).toBe(image.diskBytes);
    const raw = path.join(dir, 'layout.raw');
    await run('qemu-img', ['convert', '-O', 'raw', image.path, raw]);
    const table = JSON.parse((await run('sfdisk', ['--json', raw])).stdout).partitiontable;
    expect(table.label).toBe('gpt');
    expect(table.partitions.map((p: { type: string }) => p.type)).toEqual([
      '21686148-6453-6F6E-7420-4E6565644546',
      'C12A7328-F81F-11D2-BA4B-00A0C93EC93B',
      '4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709',
    ]);
    const esp = `${raw}@@${table.partitions[1].start * 512}`;
    const { stdout } = await run('mdir', ['-b', '-i', esp, '::/EFI/BOOT'], {
      env: { ...process.env, MTOOLS_SKIP_CHECK: '1' },
    });
    expect(stdout.trim()).toBe('::/EFI/BOOT/BOOTX64.EFI');
    // GRUB's boot code in the MBR (its "GRUB " string), the protective MBR's partition after it.
    const mbr = Buffer.alloc(512);
    const handle = await open(raw, 'r');
    await handle.read(mbr, 0, 512, 0);
    await handle.close();
    expect(mbr.subarray(0, 440).includes('GRUB ')).toBe(true);
    expect(mbr[0x1c2]).toBe(0xee);
    await rm(raw);
  });

  test.each([
    ['megasas', 'bios', 'megaraid_sas'],
    ['nvme', 'uefi', 'nvme0n1'],
  ] as const)(
    'boots from a disk behind %s under %s, takes its host name, key and user data from a NoCloud seed, and lets the key in',
    async (controller: VmDiskController, firmware: VmFirmware, driverLine: string) => {
      const name = `lab-cloud-${controller}`;
      const vmDir = path.join(dir, name);
      const key = await SshKey.loadOrGenerate(path.join(dir, `${name}.key`));
      const token = `user data of ${name} ${Date.now()}`;
      await writeImageWithSeed(image, path.join(vmDir, 'disk.img'), {
        'meta-data': `instance-id: ${name}\nlocal-hostname: ${name}\n`,
        'user-data': [
          '#cloud-config',
          'ssh_authorized_keys:',
          `  - ${key.authorizedKey}`,
          'write_files:',
          '  - path: /run/lab-user-data',
          '    permissions: "0644"',
          `    content: "${token}"`,
          '',
        ].join('\n'),
      });
      const kernel = findKernel();
      const cache = path.join(dir, 'cache');
      const started = performance.now();
      const vm = await VirtualMachine.start({
        name,
        dir: vmDir,
        blank: true,
        firmware,
        diskController: controller,
        diskSerial: `${name}-disk`,
        // Unused by a blank VM, which boots its own disk, but a VM has them.
        kernel,
        initramfs: (await buildInitramfs(cache, kernel, process.execPath)).path,
        guestDir: (await prepareGuestShare(cache)).dir,
        address: '127.0.0.1',
        sshPort: await freePort(),
        authorizedKeys: [],
        memory: 1024,
      });
      vms.push(vm);
      const consoleText = () => readFile(vm.consoleLog, 'utf8').catch(() => '');
      await eventually(
        `${name}: cloud-init finished`,
        async () =>
          /Cloud-init v\. .* finished at .*Datasource DataSourceNoCloud/.test(await consoleText()) || undefined,
        600_000,
        1_000,
      );
      console.log(`cloud image: ${name} (${firmware}) to cloud-init's end: ${seconds(started)} (${load()})`);
      const text = await consoleText();
      expect(text).toContain(driverLine);
      expect(text).toMatch(new RegExp(`${name} login:`));

      const presented: string[] = [];
      const ssh = await new Ssh2Client({
        privateKey: key.privateKey,
        username: 'debian',
        hostKeys: recordingPins(presented),
      }).dial({ host: '127.0.0.1', port: vm.options.sshPort }, { connectTimeout: 60_000 });
      try {
        const shell = async (command: string) =>
          Buffer.from((await ssh.execute(command, new Uint8Array())).stdout)
            .toString()
            .trim();
        expect(await shell('hostname')).toBe(name);
        expect(await shell('cat /run/lab-user-data')).toBe(token);
        expect(await shell('findmnt -n -o SOURCE /')).toMatch(
          controller === 'nvme' ? /^\/dev\/nvme0n1p3$/ : /^\/dev\/sda3$/,
        );
      } finally {
        await ssh.close();
      }
      console.log(`cloud image: ${name} SSH login after ${seconds(started)} (${load()})`);
      // The host key the OS presented is one cloud-init made at this first boot and printed.
      expect(presented).toHaveLength(1);
      expect(text).toContain(presented[0]?.replace(/^SHA256:/, ''));
    },
    900_000,
  );
});

/** A pin store that pins nothing for good: it records each fingerprint presented. */
function recordingPins(presented: string[]): HostKeyPinStore {
  return {
    get: async () => undefined,
    pin: async (_id, fingerprint) => {
      presented.push(fingerprint);
      return fingerprint;
    },
    unpin: async () => undefined,
  };
}

/**
 * The image on a 4 GiB raw disk, with a NoCloud seed (a FAT file system
 * labelled CIDATA holding `files`) in a 64 MiB partition at its end, where
 * the shepherd puts its config drive.
 */
async function writeImageWithSeed(image: CloudImage, disk: string, files: Record<string, string>): Promise<void> {
  await mkdir(path.dirname(disk), { recursive: true });
  await run('qemu-img', ['convert', '-O', 'raw', image.path, disk]);
  const bytes = 4 * 1024 ** 3;
  const handle = await open(disk, 'r+');
  await handle.truncate(bytes);
  await handle.close();
  const seedSectors = (64 * 1024 ** 2) / 512;
  const seedStart = bytes / 512 - 2048 - seedSectors;
  await run('sfdisk', ['--quiet', '--no-reread', '--no-tell-kernel', '--relocate', 'gpt-bak-std', disk]);
  await sfdiskAppend(disk, `start=${seedStart}, size=${seedSectors}, type=0FC63DAF-8483-4772-8E3D-4739D9F16CE4\n`);
  await run('mkfs.fat', ['-F', '16', '--offset', String(seedStart), '-n', 'CIDATA', disk, String(seedSectors / 2)]);
  const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
  for (const [file, content] of Object.entries(files)) {
    const local = path.join(path.dirname(disk), file);
    await writeFile(local, content);
    await run('mcopy', ['-i', `${disk}@@${seedStart * 512}`, local, `::/${file}`], { env });
  }
}

function sfdiskAppend(disk: string, script: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = execFile('sfdisk', ['--quiet', '--no-reread', '--no-tell-kernel', '--append', disk], (error) =>
      error ? reject(error) : resolve(),
    );
    child.stdin?.end(script);
  });
}
