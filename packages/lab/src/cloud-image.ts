import { spawn } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { cp, mkdir, open, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { LabSetupError } from './errors.js';
import { log } from './log.js';

/**
 * Where {@link buildCloudImage} keeps what it built, by default: outside any
 * checkout, so every CI run and worktree on one machine reuses one build.
 */
export const CLOUD_IMAGE_CACHE = '/var/cache/shepherd-lab/cloud-images';

/**
 * The image's Debian packages beside `mmdebstrap --variant=apt`'s: a
 * bootable system (systemd, udev, Debian's generic kernel and its initramfs,
 * whose `MODULES=most` holds the megaraid_sas and nvme drivers), GRUB's BIOS
 * and EFI modules (the boot loaders are made from them), cloud-init and what
 * its modules call (growpart, sudo for its default user), OpenSSH's server,
 * ifupdown with a DHCP client, the network cloud-init renders for Debian, and
 * ca-certificates, which cloud-init's `ca_certs` adds a config drive's CA to.
 */
const CLOUD_IMAGE_PACKAGES = [
  'systemd-sysv',
  'udev',
  'linux-image-amd64',
  'grub-pc-bin',
  'grub-efi-amd64-bin',
  'cloud-init',
  'cloud-guest-utils',
  'openssh-server',
  'sudo',
  'e2fsprogs',
  'ifupdown',
  'isc-dhcp-client',
  'iproute2',
  'netbase',
  'ca-certificates',
] as const;

/**
 * Raised with every change to what the builder makes from the same packages
 * (layout, configuration, boot loaders): part of the cache key, so an image
 * an older builder left in the cache is not taken for a new one.
 */
const BUILDER_VERSION = 1;

const SUITE = 'bookworm';
const DEFAULT_MIRROR = 'http://deb.debian.org/debian';

/** The disk: 2 GiB, a GPT of three partitions, in 512-byte sectors. cloud-init's growpart grows the root at first boot. */
const DISK_SECTORS = (2 * 1024 ** 3) / 512;
/** GRUB's BIOS core image lives in this partition, as `grub-install` embeds it on a GPT disk. */
const BIOS_BOOT = { start: 2048, size: 2048, type: '21686148-6453-6F6E-7420-4E6565644546' } as const;
const ESP = { start: 4096, size: 65536, type: 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B' } as const;
/** The root partition runs to 1 MiB before the disk's end, left for the backup GPT. */
const ROOT = {
  start: ESP.start + ESP.size,
  size: DISK_SECTORS - (ESP.start + ESP.size) - 2048,
  type: '4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709',
} as const;

/** GRUB's modules inside each core image, so it reads its configuration from the root file system unaided. */
const GRUB_CORE_MODULES = ['part_gpt', 'ext2', 'search', 'search_fs_uuid', 'normal', 'configfile', 'linux', 'echo'];
const GRUB_BIOS_MODULES = ['biosdisk', ...GRUB_CORE_MODULES, 'serial', 'terminal', 'test'];
const GRUB_EFI_MODULES = [...GRUB_CORE_MODULES, 'fat', 'serial', 'terminal', 'test', 'efi_gop'];

/** The kernel's console: the screen, and last (where systemd writes and getty asks for a login) the serial port the lab reads. */
const KERNEL_CONSOLE = 'console=tty0 console=ttyS0,115200n8';

/** Offsets in GRUB's BIOS images (grub-bios-setup's): boot.img's LBA of core.img, diskboot.img's first block list. */
const BOOT_IMG_KERNEL_SECTOR = 0x5c;
const DISKBOOT_BLOCKLIST = 512 - 12;

/** A Debian 12 cloud image {@link buildCloudImage} made or found in its cache. */
export interface CloudImage {
  /** The image, a compressed qcow2. Shared by every caller: boot it through an overlay or a copy, never itself. */
  readonly path: string;
  /** Its file's size in bytes. */
  readonly bytes: number;
  /** Its disk's size in bytes (2 GiB). */
  readonly diskBytes: number;
  /** Whether it came from the cache rather than being built by this call. */
  readonly cached: boolean;
}

/** Options of {@link buildCloudImage}. */
export interface CloudImageOptions {
  /** Where built images are kept by their inputs' hash. Default {@link CLOUD_IMAGE_CACHE}. */
  readonly cacheDir?: string;
  /** The Debian mirror mmdebstrap fetches from. Default `http://deb.debian.org/debian`. */
  readonly mirror?: string;
}

/** The Debian packages of the tools the builder runs, by program. */
const TOOLS = {
  mmdebstrap: 'mmdebstrap',
  sfdisk: 'fdisk',
  'mkfs.ext4': 'e2fsprogs',
  'mkfs.fat': 'dosfstools',
  mmd: 'mtools',
  mcopy: 'mtools',
  'grub-mkimage': 'grub-common',
  'qemu-img': 'qemu-utils',
} as const;

/**
 * A Debian 12 (bookworm) cloud image as operators install one: built by
 * `mmdebstrap` from Debian's packages (cloud-init, openssh-server,
 * linux-image-amd64, GRUB's BIOS and EFI modules, …: the package's README
 * lists them), nothing else fetched, and bootable under BIOS and UEFI from
 * one GPT disk:
 *
 * - partition 1, a BIOS boot partition holding GRUB's core image (booted by
 *   GRUB's boot.img in the MBR);
 * - partition 2, the EFI system partition (FAT, mounted at `/boot/efi`)
 *   holding GRUB as `\EFI\BOOT\BOOTX64.EFI`;
 * - partition 3, the root file system (ext4, labelled `root`).
 *
 * Both GRUBs find the root by its UUID and read `/boot/grub/grub.cfg`, which
 * boots `/vmlinuz` with the console on the screen and `ttyS0`. cloud-init
 * reads a config drive (`config-2`) or a NoCloud seed (`cidata`); the image
 * holds no SSH host keys (cloud-init makes them at first boot) and no host
 * name. Converted to a compressed qcow2 by `qemu-img`.
 *
 * The image is kept in `cacheDir` under a hash of its inputs (the packages,
 * the suite, the mirror, the builder's version) and found there by later
 * calls: a build takes minutes, a cached
 * image none. Building needs root (`mmdebstrap --mode=root`).
 *
 * @throws {@link LabSetupError} not root, a tool missing (naming its Debian package), or a step failing (naming it)
 */
export async function buildCloudImage(options: CloudImageOptions = {}): Promise<CloudImage> {
  const cacheDir = options.cacheDir ?? CLOUD_IMAGE_CACHE;
  const mirror = options.mirror ?? DEFAULT_MIRROR;
  const key = createHash('sha256')
    .update(JSON.stringify({ builder: BUILDER_VERSION, suite: SUITE, mirror, packages: CLOUD_IMAGE_PACKAGES }))
    .digest('hex')
    .slice(0, 16);
  const image = path.join(cacheDir, `debian-12-${key}.qcow2`);
  const found = await stat(image).catch(() => undefined);
  if (found) {
    log('cloud image: %s from the cache', image);
    return { path: image, bytes: found.size, diskBytes: DISK_SECTORS * 512, cached: true };
  }
  if (process.getuid?.() !== 0) {
    throw new LabSetupError(`building the cloud image ${image} needs root (mmdebstrap --mode=root)`);
  }
  // Each build in a directory of its own: two at once (two CI runs) do not share files, and the
  // image appears in the cache whole, by a rename, or not at all.
  const work = path.join(cacheDir, `build-${key}-${process.pid}`);
  await rm(work, { recursive: true, force: true });
  await mkdir(work, { recursive: true });
  try {
    const root = path.join(work, 'root');
    const started = Date.now();
    await tool('mmdebstrap', [
      '--mode=root',
      '--variant=apt',
      `--include=${CLOUD_IMAGE_PACKAGES.join(',')}`,
      // Documentation and translations: a quarter of the packages' files, nothing a boot reads.
      '--dpkgopt=path-exclude=/usr/share/doc/*',
      '--dpkgopt=path-exclude=/usr/share/man/*',
      '--dpkgopt=path-exclude=/usr/share/locale/*',
      SUITE,
      root,
      mirror,
    ]);
    log('cloud image: mmdebstrap took %d s', Math.round((Date.now() - started) / 1000));
    const rootUuid = randomUUID();
    const espId = createHash('sha256').update(rootUuid).digest('hex').slice(0, 8).toUpperCase();
    await configure(root, rootUuid, espId);
    const raw = path.join(work, 'disk.raw');
    await makeDisk(work, root, raw, rootUuid, espId);
    const partial = path.join(work, 'image.qcow2');
    await tool('qemu-img', ['convert', '-c', '-f', 'raw', '-O', 'qcow2', raw, partial]);
    await rename(partial, image);
    log('cloud image: %s built in %d s', image, Math.round((Date.now() - started) / 1000));
    return { path: image, bytes: (await stat(image)).size, diskBytes: DISK_SECTORS * 512, cached: false };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/** What the installed system reads at boot: its file systems, GRUB's configuration, cloud-init's data sources. */
async function configure(root: string, rootUuid: string, espId: string): Promise<void> {
  const espUuid = `${espId.slice(0, 4)}-${espId.slice(4)}`;
  await writeFile(
    path.join(root, 'etc/fstab'),
    `UUID=${rootUuid} / ext4 errors=remount-ro 0 1\n` +
      // nofail: a machine whose ESP is gone (a BIOS one, an operator's repartitioning) still boots.
      `UUID=${espUuid} /boot/efi vfat umask=0077,nofail 0 1\n`,
  );
  await mkdir(path.join(root, 'boot/efi'), { recursive: true });
  // GRUB's modules beside its configuration, as grub-install leaves them, for what the core images lack.
  for (const platform of ['i386-pc', 'x86_64-efi']) {
    await cp(path.join(root, 'usr/lib/grub', platform), path.join(root, 'boot/grub', platform), { recursive: true });
  }
  await writeFile(
    path.join(root, 'boot/grub/grub.cfg'),
    [
      "# Written by the lab's image builder: /vmlinuz and /initrd.img follow the installed kernel.",
      'set default=0',
      'set timeout=0',
      'serial --unit=0 --speed=115200',
      'terminal_input serial console',
      'terminal_output serial console',
      "menuentry 'Debian GNU/Linux 12' {",
      `  linux /vmlinuz root=UUID=${rootUuid} ro ${KERNEL_CONSOLE}`,
      '  initrd /initrd.img',
      '}',
      '',
    ].join('\n'),
  );
  // Every machine makes its own host keys at first boot (cloud-init's ssh module) and gets its
  // name from its meta data: none of the build machine's, nor one shared by every installation.
  for (const file of await readdir(path.join(root, 'etc/ssh'))) {
    if (file.startsWith('ssh_host_')) await rm(path.join(root, 'etc/ssh', file));
  }
  await writeFile(path.join(root, 'etc/hostname'), 'localhost\n');
  await writeFile(path.join(root, 'etc/hosts'), '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n');
  await rm(path.join(root, 'etc/resolv.conf'), { force: true });
  await writeFile(
    path.join(root, 'etc/cloud/cloud.cfg.d/90_lab.cfg'),
    [
      "# Written by the lab's image builder. A machine's own data: a config drive (config-2) as the",
      '# shepherd writes one, or a NoCloud seed (cidata); no network metadata service to wait for.',
      'datasource_list: [ConfigDrive, NoCloud, None]',
      '# The one locale the image has without generating any (Debian defaults to en_US.UTF-8).',
      'locale: C.UTF-8',
      '',
    ].join('\n'),
  );
}

/** The raw disk: its GPT, the root file system (from `root`), the ESP with GRUB EFI, GRUB BIOS's boot code. */
async function makeDisk(work: string, root: string, raw: string, rootUuid: string, espId: string): Promise<void> {
  await writeFile(raw, '');
  const handle = await open(raw, 'r+');
  try {
    await handle.truncate(DISK_SECTORS * 512);
  } finally {
    await handle.close();
  }
  const partition = (p: { start: number; size: number; type: string }, name: string) =>
    `start=${p.start}, size=${p.size}, type=${p.type}, name="${name}"`;
  await tool(
    'sfdisk',
    ['--quiet', '--no-reread', '--no-tell-kernel', raw],
    ['label: gpt', partition(BIOS_BOOT, 'BIOS boot'), partition(ESP, 'EFI system'), partition(ROOT, 'root'), ''].join(
      '\n',
    ),
  );
  // Both GRUBs start from this: find the root by its UUID, and read /boot/grub/grub.cfg there.
  const early = path.join(work, 'early.cfg');
  await writeFile(early, `search --no-floppy --fs-uuid --set=root ${rootUuid}\nset prefix=($root)/boot/grub\n`);
  const core = path.join(work, 'core.img');
  const loader = path.join(work, 'BOOTX64.EFI');
  const grub = path.join(root, 'usr/lib/grub');
  await tool('grub-mkimage', [
    '-O',
    'i386-pc',
    '-d',
    `${grub}/i386-pc`,
    '-o',
    core,
    '-p',
    '/boot/grub',
    '-c',
    early,
    ...GRUB_BIOS_MODULES,
  ]);
  await tool('grub-mkimage', [
    '-O',
    'x86_64-efi',
    '-d',
    `${grub}/x86_64-efi`,
    '-o',
    loader,
    '-p',
    '/boot/grub',
    '-c',
    early,
    ...GRUB_EFI_MODULES,
  ]);

  await tool('mkfs.ext4', [
    '-q',
    '-F',
    // GRUB 2.06 (bookworm's) refuses ext4 with these features, which newer mke2fs turn on by default.
    '-O',
    '^metadata_csum_seed,^orphan_file',
    '-L',
    'root',
    '-U',
    rootUuid,
    '-d',
    root,
    '-E',
    `offset=${ROOT.start * 512}`,
    raw,
    `${ROOT.size / 2}k`,
  ]);
  // FAT16: 32 MiB is too small for FAT32. Hidden sectors: the partition's start.
  await tool('mkfs.fat', [
    '-F',
    '16',
    '--offset',
    String(ESP.start),
    '-h',
    String(ESP.start),
    '-i',
    espId,
    '-n',
    'ESP',
    raw,
    String(ESP.size / 2),
  ]);
  const esp = `${raw}@@${ESP.start * 512}`;
  await tool('mmd', ['-i', esp, '::/EFI', '::/EFI/BOOT']);
  await tool('mcopy', ['-i', esp, loader, '::/EFI/BOOT/BOOTX64.EFI']);

  // What grub-bios-setup does for a core image embedded in a BIOS boot partition: boot.img (the
  // MBR's code, its first 440 bytes; the partition table stays sfdisk's) loads core.img's first
  // sector from the partition's start, and that sector (diskboot.img) the rest from its block list.
  const boot = Buffer.from(await readFile(path.join(grub, 'i386-pc/boot.img')));
  boot.writeBigUInt64LE(BigInt(BIOS_BOOT.start), BOOT_IMG_KERNEL_SECTOR);
  const coreImage = Buffer.from(await readFile(core));
  const sectors = Math.ceil(coreImage.length / 512);
  if (sectors > BIOS_BOOT.size) {
    throw new LabSetupError(
      `GRUB's core image ${core} (${coreImage.length} bytes) does not fit its BIOS boot partition`,
    );
  }
  coreImage.writeBigUInt64LE(BigInt(BIOS_BOOT.start + 1), DISKBOOT_BLOCKLIST);
  coreImage.writeUInt16LE(sectors - 1, DISKBOOT_BLOCKLIST + 8);
  const out = await open(raw, 'r+');
  try {
    await out.write(boot, 0, 440, 0);
    await out.write(coreImage, 0, coreImage.length, BIOS_BOOT.start * 512);
  } finally {
    await out.close();
  }
}

/** Runs one of {@link TOOLS} with `input` on its stdin; its output's end goes into the error when it fails. */
async function tool(program: keyof typeof TOOLS, args: readonly string[], input?: string): Promise<void> {
  // mtools checks a disk's geometry against its size; a file system in a file has none to check.
  const env = { ...process.env, MTOOLS_SKIP_CHECK: '1' };
  await new Promise<void>((resolve, reject) => {
    const child = spawn(program, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    const keep = (chunk: Buffer) => {
      output = (output + chunk.toString('utf8')).slice(-4000);
    };
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    child.stdin.on('error', () => undefined);
    child.stdin.end(input ?? '');
    child.once('error', (error: NodeJS.ErrnoException) =>
      reject(
        error.code === 'ENOENT'
          ? new LabSetupError(`${program} not found: install Debian's ${TOOLS[program]} package`)
          : error,
      ),
    );
    child.once('close', (code, signal) =>
      code === 0
        ? resolve()
        : reject(
            new LabSetupError(`${program} ${args.join(' ')} failed (${signal ?? `exit ${code}`}): ${output.trim()}`),
          ),
    );
  });
}
