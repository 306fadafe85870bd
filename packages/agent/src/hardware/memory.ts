import { listNames, readText } from './files.js';
import { type SmbiosStructure, smbiosMemoryModules } from './smbios.js';

/** The machine's memory: installed (what the modules hold) and usable (what the kernel got). */
export interface MemoryRecord {
  /** Bytes installed: the sum of the SMBIOS memory modules, else of sysfs's online memory blocks; 0 if neither. */
  readonly installedBytes: number;
  /** Where `installedBytes` came from. */
  readonly installedFrom: 'smbios' | 'sysfs' | 'none';
  /** The size of each SMBIOS memory module, in bytes (empty without SMBIOS). */
  readonly moduleBytes: readonly number[];
  /** Bytes the kernel can use: MemTotal of /proc/meminfo; 0 when unreadable. */
  readonly usableBytes: number;
}

/**
 * Memory installed, from the SMBIOS memory devices (type 17) or, without
 * them, the online memory blocks of /sys/devices/system/memory; usable from
 * /proc/meminfo.
 */
export async function readMemory(
  root: string,
  smbios: readonly SmbiosStructure[] | undefined,
  warnings: string[],
): Promise<MemoryRecord> {
  const moduleBytes = smbios ? smbiosMemoryModules(smbios) : [];
  const usableBytes = await memTotal(root, warnings);
  if (moduleBytes.length > 0) {
    return { installedBytes: sum(moduleBytes), installedFrom: 'smbios', moduleBytes, usableBytes };
  }
  const blocks = await onlineMemoryBlocks(root, warnings);
  if (blocks !== undefined) return { installedBytes: blocks, installedFrom: 'sysfs', moduleBytes, usableBytes };
  return { installedBytes: 0, installedFrom: 'none', moduleBytes, usableBytes };
}

async function memTotal(root: string, warnings: string[]): Promise<number> {
  const meminfo = await readText(root, 'proc/meminfo');
  const match = meminfo && /^MemTotal:\s+(\d+)\s+kB$/m.exec(meminfo);
  if (!match) {
    warnings.push('/proc/meminfo has no MemTotal: usable memory unknown');
    return 0;
  }
  return Number(match[1]) * 1024;
}

/** Bytes in online memory blocks (block_size_bytes is hex), or undefined when sysfs has no memory blocks. */
async function onlineMemoryBlocks(root: string, warnings: string[]): Promise<number | undefined> {
  const dir = 'sys/devices/system/memory';
  const blockSize = await readText(root, `${dir}/block_size_bytes`);
  if (blockSize === undefined || !/^[0-9a-fA-F]+$/.test(blockSize)) {
    warnings.push(`/${dir}/block_size_bytes unreadable: memory installed unknown`);
    return undefined;
  }
  let online = 0;
  for (const name of await listNames(root, dir)) {
    if (!/^memory\d+$/.test(name)) continue;
    // Upstream's fallback reads a path it never formats (".../%s/state"), so it counts nothing; this one reads each block's.
    if ((await readText(root, `${dir}/${name}/state`)) === 'online') online++;
  }
  return online * Number.parseInt(blockSize, 16);
}

function sum(values: readonly number[]): number {
  return values.reduce((a, b) => a + b, 0);
}
