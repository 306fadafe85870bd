import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { copyFile, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzip } from 'node:zlib';
import { type CpioEntry, cpioArchive } from './cpio.js';
import { AgentImageError } from './errors.js';
import { declaredFirmware, FIRMWARE_DIR, findFirmware, type ImageFirmware, type MissingFirmware } from './firmware.js';
import {
  AGENT_PATH,
  CONFIG_DIR,
  DHCP_ON_LINK,
  DHCP_ON_LINK_TEXT,
  INIT_SCRIPT,
  UDHCPC_SCRIPT,
  UDHCPC_SCRIPT_TEXT,
} from './init-script.js';
import { BOOT_FILES, checkBootFiles, writeIso } from './iso.js';
import { type BootKernel, findKernel, sharedLibraries } from './kernel.js';
import { type ImageModules, imageModules, moduleName } from './modules.js';
import { writeTakeoverPayload } from './payload.js';
import { tool } from './tools.js';

/** Bump when the layout changes in a way the inputs' contents do not show. */
const FORMAT = 3;
/**
 * gzip's level. gzip rather than zstd (38 MiB at level 3, against 41 MiB here): busybox reads
 * gzip, so the takeover payload takes node and kexec out of this initramfs on a machine that
 * has nothing but a shell, and node is not carried twice.
 */
const GZIP_LEVEL = 6;

/** Options of {@link buildAgentImage}. */
export interface AgentImageOptions {
  /** Where `vmlinuz`, `initramfs` and `agent.iso` are written. */
  readonly out: string;
  /** Built parts, by their inputs' hash. Default `~/.cache/bmaas/agent-image`. */
  readonly cacheDir?: string;
  /** Default {@link findKernel}'s. */
  readonly kernel?: BootKernel;
  /** The node the environment runs the agent with. Default this process's. */
  readonly node?: string;
  /** The bundled agent. Default this package's `dist/agent.cjs` (`npm run bundle -w @bmaas/agent`). */
  readonly agentBundle?: string;
  /** Flags of the takeover payload's `takeover` (and so of the agent): `--interval=30s`. */
  readonly takeoverFlags?: readonly string[];
  /**
   * Where the firmware the image's drivers declare is looked up (Debian's
   * firmware packages install there). Default `/lib/firmware`.
   */
  readonly firmwareDir?: string;
}

/** A built agent image: its files, their sizes, and what came from the cache. */
export interface AgentImage {
  readonly kernel: BootKernel;
  readonly vmlinuz: string;
  /** gzip-compressed cpio. */
  readonly initramfs: string;
  readonly iso: string;
  /** The takeover payload the shepherd uploads ({@link writeTakeoverPayload}). */
  readonly takeover: string;
  readonly initramfsBytes: number;
  readonly isoBytes: number;
  readonly takeoverBytes: number;
  /** The initramfs and the ISO were found in the cache, not built. */
  readonly cached: { readonly initramfs: boolean; readonly iso: boolean };
  /** The modules carried, relative to the kernel's modules directory (`kernel/drivers/...ko`). */
  readonly modules: readonly string[];
  /** The declared firmware carried, by its path under `/lib/firmware`. */
  readonly firmware: readonly string[];
  /** The firmware the carried drivers declare that the firmware directory does not have. */
  readonly missingFirmware: readonly MissingFirmware[];
  /** The firmware directory looked in. */
  readonly firmwareDir: string;
}

const BUSYBOX = { path: '/bin/busybox', pkg: 'busybox-static' };
const KEXEC = { path: '/usr/sbin/kexec', pkg: 'kexec-tools' };
/**
 * The decompressors an installation runs for xz and zstd images (Node 20's
 * zlib has neither); they replace busybox's `xz` applet, which has no memory
 * limit, and the image has no other `zstd`.
 */
const DECOMPRESSORS = [
  { path: '/usr/bin/xz', pkg: 'xz-utils' },
  { path: '/usr/bin/zstd', pkg: 'zstd' },
];
/** Where node goes in the initramfs. */
const NODE_PATH = '/usr/bin/node';

/**
 * Builds the agent environment from this machine's Debian packages: Debian's
 * kernel, an initramfs (busybox, node and its libraries, the agent bundle,
 * the kernel's NIC and storage driver families with the firmware they
 * declare that the firmware directory has, /init) and a hybrid ISO booting them under BIOS
 * and UEFI. Each part is cached under `cacheDir` by the hash of its inputs'
 * contents, so a second build copies what did not change.
 *
 * @throws {@link AgentImageError} naming the missing file, its Debian package, or the failing tool
 */
export async function buildAgentImage(options: AgentImageOptions): Promise<AgentImage> {
  const kernel = options.kernel ?? findKernel();
  const node = options.node ?? process.execPath;
  const agentBundle = options.agentBundle ?? fileURLToPath(new URL('../agent.cjs', import.meta.url));
  const cacheDir = options.cacheDir ?? path.join(homedir(), '.cache', 'bmaas', 'agent-image');
  await stat(agentBundle).catch(() => {
    throw new AgentImageError(`${agentBundle} is missing: build it with npm run bundle -w @bmaas/agent`);
  });
  for (const program of [BUSYBOX, KEXEC, ...DECOMPRESSORS]) {
    await stat(program.path).catch(() => {
      throw new AgentImageError(`${program.path} is missing: install Debian's ${program.pkg} package`);
    });
  }
  await checkBootFiles();
  await mkdir(cacheDir, { recursive: true });
  await mkdir(options.out, { recursive: true });

  const modules = await imageModules(kernel);
  const firmwareDir = options.firmwareDir ?? FIRMWARE_DIR;
  // Each module is read once: its content for the cache key, its .modinfo for the firmware it declares.
  const moduleHashes: string[] = [];
  const declared: { module: string; firmware: string[] }[] = [];
  for (const file of modules.files) {
    const data = await readFile(path.join(kernel.modules, file));
    moduleHashes.push(`${file} ${createHash('sha256').update(data).digest('hex')}\n`);
    declared.push({ module: moduleName(file), firmware: declaredFirmware(data, file) });
  }
  const firmware = await findFirmware(firmwareDir, declared);
  const libraries = await sharedLibraries([node, KEXEC.path]);
  // Only the initramfs runs them: the takeover payload (an agent in place installs nothing) carries neither.
  const decompressors = DECOMPRESSORS.map((program) => program.path);
  const decompressorLibraries = (await sharedLibraries(decompressors)).filter(
    (library) => !libraries.includes(library),
  );
  const replaced = new Set(decompressors.map((program) => path.basename(program)));
  const applets = (await promisify(execFile)(BUSYBOX.path, ['--list'])).stdout
    .split('\n')
    .filter((applet) => applet !== '' && applet !== 'busybox' && !replaced.has(applet));
  const inputs = [
    BUSYBOX.path,
    KEXEC.path,
    ...decompressors,
    ...decompressorLibraries,
    node,
    agentBundle,
    ...libraries,
    ...firmware.found.map((file) => file.source),
  ];
  const initramfsKey = createHash('sha256').update(
    `format ${FORMAT} gzip ${GZIP_LEVEL}\n${INIT_SCRIPT}\n${UDHCPC_SCRIPT_TEXT}\n${DHCP_ON_LINK_TEXT}\n${applets.join(' ')}\n${modules.dep}${modules.alias}`,
  );
  for (const line of moduleHashes) initramfsKey.update(line);
  for (const file of firmware.found) initramfsKey.update(`firmware ${file.name}\n`);
  for (const input of inputs) initramfsKey.update(`${input} ${await contentHash(input)}\n`);
  const initramfsHash = initramfsKey.digest('hex').slice(0, 16);
  const initramfs = path.join(cacheDir, `initramfs-${initramfsHash}.gz`);
  const initramfsCached = await exists(initramfs);
  if (!initramfsCached) {
    const entries = initramfsEntries({
      node,
      agentBundle,
      programs: decompressors,
      libraries: [...libraries, ...decompressorLibraries],
      applets,
      modules,
      firmware,
      kernel,
    });
    const archive = cpioArchive(await loadEntries(entries));
    await writeFile(`${initramfs}.${process.pid}.tmp`, await promisify(gzip)(archive, { level: GZIP_LEVEL }));
    await rename(`${initramfs}.${process.pid}.tmp`, initramfs);
  }

  const isoKey = createHash('sha256').update(`format ${FORMAT}\ninitramfs ${initramfsHash}\n`);
  for (const input of [kernel.image, ...Object.values(BOOT_FILES).map((file) => file.path)]) {
    isoKey.update(`${input} ${await contentHash(input)}\n`);
  }
  isoKey.update((await tool('grub-mkimage', ['--version'])).trim());
  const iso = path.join(cacheDir, `agent-${isoKey.digest('hex').slice(0, 16)}.iso`);
  const isoCached = await exists(iso);
  if (!isoCached) {
    const work = await mkdtemp(path.join(cacheDir, 'iso-'));
    try {
      const config = path.join(work, 'config.cpio');
      // The generic ISO's config: an empty archive. A machine's copy replaces it (configureAgentIso).
      await writeFile(config, cpioArchive([]));
      await writeIso(work, { kernel: kernel.image, initramfs, config }, iso);
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  }

  const result = {
    kernel,
    vmlinuz: path.join(options.out, 'vmlinuz'),
    initramfs: path.join(options.out, 'initramfs'),
    iso: path.join(options.out, 'agent.iso'),
    takeover: path.join(options.out, 'takeover'),
  };
  await pruneCache(cacheDir, 'initramfs-', '.gz', initramfs);
  await pruneCache(cacheDir, 'agent-', '.iso', iso);
  await copyFile(kernel.image, result.vmlinuz);
  await copyFile(initramfs, result.initramfs);
  await copyFile(iso, result.iso);
  const takeoverBytes = await writeTakeoverPayload(
    {
      busybox: BUSYBOX.path,
      vmlinuz: result.vmlinuz,
      initramfs: result.initramfs,
      runtime: [NODE_PATH, AGENT_PATH, KEXEC.path, ...libraries],
      libraryDirs: [...new Set(libraries.map((library) => path.dirname(library)))],
      loader: libraries.find((library) => /\/ld-linux[^/]*\.so/.test(library)) ?? '/lib64/ld-linux-x86-64.so.2',
      flags: options.takeoverFlags,
    },
    result.takeover,
  );
  return {
    ...result,
    initramfsBytes: (await stat(result.initramfs)).size,
    isoBytes: (await stat(result.iso)).size,
    takeoverBytes,
    cached: { initramfs: initramfsCached, iso: isoCached },
    modules: modules.files,
    firmware: firmware.found.map((file) => file.name),
    missingFirmware: firmware.missing,
    firmwareDir,
  };
}

type Planned = CpioEntry | { readonly kind: 'copy'; readonly path: string; readonly source: string };

/** The initramfs's layout; files to copy are read later, in {@link loadEntries}. */
function initramfsEntries(parts: {
  node: string;
  agentBundle: string;
  /** Programs copied to the same path. */
  programs: readonly string[];
  libraries: readonly string[];
  applets: readonly string[];
  modules: ImageModules;
  firmware: ImageFirmware;
  kernel: BootKernel;
}): Planned[] {
  const entries: Planned[] = [];
  const dirs = new Set<string>();
  const dir = (p: string) => {
    const names = p.split('/').filter((name) => name !== '');
    for (let i = 1; i <= names.length; i++) {
      const d = `/${names.slice(0, i).join('/')}`;
      if (dirs.has(d)) continue;
      dirs.add(d);
      entries.push({ kind: 'dir', path: d, mode: d === '/tmp' ? 0o1777 : 0o755 });
    }
  };
  for (const d of [
    '/bin',
    '/sbin',
    '/usr/bin',
    '/usr/sbin',
    '/proc',
    '/sys',
    '/dev',
    '/run',
    '/tmp',
    '/var/log',
    '/lib64',
  ]) {
    dir(d);
  }
  dir(CONFIG_DIR);
  const copy = (source: string, destination = source) => {
    dir(path.dirname(destination));
    entries.push({ kind: 'copy', path: destination, source });
  };
  copy(BUSYBOX.path);
  copy(KEXEC.path);
  for (const program of parts.programs) copy(program);
  copy(parts.node, NODE_PATH);
  copy(parts.agentBundle, AGENT_PATH);
  for (const library of parts.libraries) copy(library);
  // busybox's modprobe reads modules.dep and modules.alias from /lib/modules/<release>.
  const modulesDir = `/lib/modules/${parts.kernel.release}`;
  for (const module of parts.modules.files) copy(path.join(parts.kernel.modules, module), `${modulesDir}/${module}`);
  for (const file of parts.firmware.found) copy(file.source, `/lib/firmware/${file.name}`);
  for (const applet of parts.applets) entries.push({ kind: 'symlink', path: `/bin/${applet}`, target: '/bin/busybox' });
  // Where the kernel runs modprobe from for what it requests itself (a filesystem, a crypto algorithm, a bond).
  entries.push({ kind: 'symlink', path: '/sbin/modprobe', target: '/bin/busybox' });
  entries.push({ kind: 'file', path: '/init', data: Buffer.from(INIT_SCRIPT), mode: 0o755 });
  entries.push({ kind: 'file', path: UDHCPC_SCRIPT, data: Buffer.from(UDHCPC_SCRIPT_TEXT), mode: 0o755 });
  entries.push({ kind: 'file', path: DHCP_ON_LINK, data: Buffer.from(DHCP_ON_LINK_TEXT), mode: 0o755 });
  entries.push({ kind: 'file', path: `${modulesDir}/modules.dep`, data: Buffer.from(parts.modules.dep), mode: 0o644 });
  entries.push({
    kind: 'file',
    path: `${modulesDir}/modules.alias`,
    data: Buffer.from(parts.modules.alias),
    mode: 0o644,
  });
  return entries;
}

/** Reads each file to copy; the first entry of a path wins. */
async function loadEntries(planned: readonly Planned[]): Promise<CpioEntry[]> {
  const seen = new Set<string>();
  const entries: CpioEntry[] = [];
  for (const entry of planned) {
    if (seen.has(entry.path)) continue;
    seen.add(entry.path);
    if (entry.kind !== 'copy') {
      entries.push(entry);
      continue;
    }
    const s = await stat(entry.source);
    entries.push({ kind: 'file', path: entry.path, data: await readFile(entry.source), mode: s.mode & 0o7777 });
  }
  return entries;
}

/**
 * Removes the cache's older builds of a kind (`prefix`...`suffix`): each is tens of
 * MiB, and every change of an input makes a new one. `current` and the
 * newest other stay (a build with other inputs may be reading it).
 */
async function pruneCache(cacheDir: string, prefix: string, suffix: string, current: string): Promise<void> {
  const others = [];
  for (const name of await readdir(cacheDir)) {
    const file = path.join(cacheDir, name);
    // Files being written end otherwise (.tmp, .cpio).
    if (!name.startsWith(prefix) || !name.endsWith(suffix) || file === current) continue;
    const modified = await stat(file).then(
      (s) => s.mtimeMs,
      () => undefined,
    );
    if (modified !== undefined) others.push({ file, modified });
  }
  others.sort((a, b) => b.modified - a.modified);
  for (const { file } of others.slice(1)) await rm(file, { force: true });
}

async function contentHash(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

async function exists(file: string): Promise<boolean> {
  return stat(file).then(
    () => true,
    () => false,
  );
}
