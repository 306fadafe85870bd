// Which of the kernel's modules the agent image carries, and the modules.dep and modules.alias
// through which the image's modprobe loads them by the devices present (init-script.ts).
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { AgentImageError } from './errors.js';
import type { BootKernel } from './kernel.js';

/**
 * Directories of the kernel's module tree the image carries whole: every
 * Ethernet NIC, SCSI (SAS HBAs, RAID controllers, SCSI disks), NVMe and ATA
 * driver, LSI's older Fusion-MPT SAS, and virtio's bus (a VM's devices).
 */
export const DRIVER_FAMILIES = [
  'kernel/drivers/net/ethernet/',
  'kernel/drivers/scsi/',
  'kernel/drivers/nvme/',
  'kernel/drivers/ata/',
  'kernel/drivers/message/fusion/',
  'kernel/drivers/virtio/',
] as const;

/**
 * Modules the image carries by name: Intel VMD (the NVMe drives of many
 * Xeon servers sit behind it), virtio's disk and NIC, and what no device asks
 * for but the kernel requests itself: efivarfs (its mount under UEFI), bonds
 * and VLANs (a captured network's `ip link add`).
 */
export const NAMED_MODULES = ['vmd', 'virtio_blk', 'virtio_net', 'efivarfs', 'bonding', '8021q'] as const;

/** The image's modules: their files and the two indexes busybox's modprobe reads. */
export interface ImageModules {
  /** Module files relative to the kernel's modules directory (`kernel/drivers/...ko`), sorted. */
  readonly files: readonly string[];
  /** The kernel's modules.dep lines of those files (each names all its dependencies, all carried). */
  readonly dep: string;
  /** The kernel's modules.alias lines naming those modules: what a device's modalias resolves through. */
  readonly alias: string;
}

/** A module's name as modprobe and modules.alias spell it: `crc32c-intel.ko` is `crc32c_intel`. */
export function moduleName(file: string): string {
  return path
    .basename(file)
    .replace(/\.ko(\.\w+)?$/, '')
    .replace(/-/g, '_');
}

/** A modules.alias pattern (fnmatch: `*`, `?`, `[...]`) as an anchored regular expression. */
export function aliasPattern(pattern: string): RegExp {
  let source = '';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i] as string;
    if (c === '*') source += '.*';
    else if (c === '?') source += '.';
    else if (c === '[') {
      const end = pattern.indexOf(']', i + 2);
      if (end === -1) source += '\\[';
      else {
        source += `[${pattern
          .slice(i + 1, end)
          .replace(/^!/, '^')
          .replace(/\\/g, '\\\\')}]`;
        i = end;
      }
    } else source += c.replace(/[.+^${}()|\\/]/g, '\\$&');
  }
  return new RegExp(`^${source}$`);
}

/**
 * The kernel's modules the image carries: {@link DRIVER_FAMILIES},
 * {@link NAMED_MODULES}, the modules those need (modules.dep) and want loaded
 * before them (modules.softdep's `pre:`, such as libcrc32c's crc32c), with
 * the lines of modules.dep and modules.alias naming them.
 *
 * @throws {@link AgentImageError} when the modules are compressed (busybox's modprobe cannot load them)
 */
export async function imageModules(kernel: BootKernel): Promise<ImageModules> {
  const read = (file: string) => readFile(path.join(kernel.modules, file), 'utf8');
  const depLines = new Map<string, string>();
  const needs = new Map<string, string[]>();
  const fileOf = new Map<string, string>();
  for (const line of (await read('modules.dep')).split('\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const file = line.slice(0, colon);
    const rest = line.slice(colon + 1).trim();
    depLines.set(file, line);
    needs.set(file, rest === '' ? [] : rest.split(/\s+/));
    fileOf.set(moduleName(file), file);
  }
  const aliases: { pattern: string; module: string }[] = [];
  for (const line of (await read('modules.alias')).split('\n')) {
    const [word, pattern, module] = line.split(/\s+/);
    if (word === 'alias' && pattern !== undefined && module !== undefined) aliases.push({ pattern, module });
  }
  // softdep MODULE pre: A B post: C: the pre ones are loaded first, by name or alias (`crypto-crc32c`).
  const softPre = new Map<string, string[]>();
  const softdep = await read('modules.softdep').catch(() => '');
  for (const line of softdep.split('\n')) {
    const [word, module, ...rest] = line.trim().split(/\s+/);
    if (word !== 'softdep' || module === undefined) continue;
    const pre: string[] = [];
    let inPre = false;
    for (const token of rest) {
      if (token.endsWith(':')) inPre = token === 'pre:';
      else if (inPre) pre.push(token);
    }
    softPre.set(module.replace(/-/g, '_'), [...(softPre.get(module.replace(/-/g, '_')) ?? []), ...pre]);
  }
  const resolve = (nameOrAlias: string): string[] => {
    const file = fileOf.get(nameOrAlias.replace(/-/g, '_'));
    if (file !== undefined) return [file];
    return aliases
      .filter(({ pattern }) => {
        // Only a pattern whose text before its first wildcard starts the name can match it.
        const literal = pattern.split(/[*?[]/, 1)[0] as string;
        return nameOrAlias.startsWith(literal) && aliasPattern(pattern).test(nameOrAlias);
      })
      .map(({ module }) => fileOf.get(module))
      .filter((found) => found !== undefined);
  };

  const files = new Set<string>();
  const add = (file: string) => {
    if (files.has(file)) return;
    files.add(file);
    for (const dependency of needs.get(file) ?? []) add(dependency);
    for (const wanted of softPre.get(moduleName(file)) ?? []) for (const found of resolve(wanted)) add(found);
  };
  for (const file of depLines.keys()) if (DRIVER_FAMILIES.some((family) => file.startsWith(family))) add(file);
  for (const name of NAMED_MODULES) for (const found of resolve(name)) add(found);

  const sorted = [...files].sort();
  const compressed = sorted.find((file) => /\.ko\.\w+$/.test(file));
  if (compressed !== undefined) {
    throw new AgentImageError(
      `${kernel.modules} has compressed modules (${compressed}), which busybox's modprobe cannot load`,
    );
  }
  const names = new Set(sorted.map(moduleName));
  return {
    files: sorted,
    dep: sorted.map((file) => `${depLines.get(file)}\n`).join(''),
    alias: aliases
      .filter(({ module }) => names.has(module))
      .map(({ pattern, module }) => `alias ${pattern} ${module}\n`)
      .join(''),
  };
}
