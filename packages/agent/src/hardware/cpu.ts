import { readText } from './files.js';

/** One CPU package (socket), from /proc/cpuinfo. */
export interface CpuRecord {
  /** The package's `physical id` (0 where cpuinfo gives none). */
  readonly socket: number;
  /** `vendor_id`: GenuineIntel, AuthenticAMD. */
  readonly vendor: string;
  /** `model name`. */
  readonly model: string;
  /** x86 family, model number and stepping, where cpuinfo gives them. */
  readonly x86?: { readonly family: number; readonly model: number; readonly stepping: number };
  /** Distinct cores (`core id`) in the package. */
  readonly cores: number;
  /** Logical processors (hardware threads) in the package. */
  readonly threads: number;
}

/**
 * The machine's CPU packages. Unlike upstream, which counts the distinct
 * core IDs of all processors together (core IDs restart in every package,
 * so two sockets count as one), each package is a record of its own.
 */
export async function readCpus(root: string, warnings: string[]): Promise<CpuRecord[]> {
  const cpuinfo = await readText(root, 'proc/cpuinfo');
  if (cpuinfo === undefined) {
    warnings.push('/proc/cpuinfo unreadable: no CPUs reported');
    return [];
  }
  return parseCpuinfo(cpuinfo);
}

/** Groups cpuinfo's processor blocks (separated by blank lines) by package. */
export function parseCpuinfo(cpuinfo: string): CpuRecord[] {
  interface Package {
    first: Map<string, string>;
    cores: Set<string>;
    threads: number;
  }
  const packages = new Map<number, Package>();
  for (const block of cpuinfo.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    for (const line of block.split('\n')) {
      const colon = line.indexOf(':');
      if (colon > 0) fields.set(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
    }
    if (!fields.has('processor')) continue;
    const socket = Number(fields.get('physical id') ?? '0');
    const entry = packages.get(socket) ?? { first: fields, cores: new Set<string>(), threads: 0 };
    entry.cores.add(fields.get('core id') ?? fields.get('processor') ?? '');
    entry.threads++;
    packages.set(socket, entry);
  }
  return [...packages.entries()]
    .sort(([a], [b]) => a - b)
    .map(([socket, { first, cores, threads }]) => {
      const family = integer(first.get('cpu family'));
      const model = integer(first.get('model'));
      const stepping = integer(first.get('stepping'));
      return {
        socket,
        vendor: first.get('vendor_id') ?? '',
        model: first.get('model name') ?? '',
        ...(family !== undefined &&
          model !== undefined &&
          stepping !== undefined && { x86: { family, model, stepping } }),
        cores: cores.size,
        threads,
      };
    });
}

function integer(text: string | undefined): number | undefined {
  return text !== undefined && /^\d+$/.test(text) ? Number(text) : undefined;
}
