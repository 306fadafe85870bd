import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync, readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { AgentImageError } from './errors.js';

/** Debian's kernel (`linux-image-amd64`) and its modules. */
export interface BootKernel {
  readonly release: string;
  /** `/boot/vmlinuz-<release>`. */
  readonly image: string;
  /** `/lib/modules/<release>`. */
  readonly modules: string;
}

/**
 * The newest `/boot/vmlinuz-*` whose modules are installed too (what boots
 * it loads disk and network drivers from them).
 *
 * @throws {@link AgentImageError} naming the package when there is none, or the file when it is unreadable
 */
export function findKernel(boot = '/boot', modules = '/lib/modules'): BootKernel {
  const releases = existsSync(boot)
    ? readdirSync(boot)
        .filter((name) => name.startsWith('vmlinuz-'))
        .map((name) => name.slice('vmlinuz-'.length))
        .filter((release) => existsSync(path.join(modules, release, 'modules.dep')))
        .sort((a, b) => a.localeCompare(b, 'en', { numeric: true }))
    : [];
  const release = releases.at(-1);
  if (release === undefined) {
    throw new AgentImageError(
      `no kernel with its modules in ${boot} and ${modules}: install Debian's linux-image-amd64 package (apt-get install linux-image-amd64)`,
    );
  }
  const image = path.join(boot, `vmlinuz-${release}`);
  try {
    accessSync(image, constants.R_OK);
  } catch {
    throw new AgentImageError(
      `${image} is not readable by this user (some distributions make it 0600): build as root, or chmod 644 it`,
    );
  }
  return { release, image, modules: path.join(modules, release) };
}

/**
 * `wanted` modules and their dependencies from modules.dep, each after what
 * it needs, as paths relative to the modules directory. A name not in
 * modules.dep is built into the kernel (or absent) and left out.
 *
 * @throws {@link AgentImageError} when the modules are compressed (busybox's insmod cannot load them)
 */
export async function moduleOrder(kernel: BootKernel, wanted: readonly string[]): Promise<string[]> {
  const dep = await readFile(path.join(kernel.modules, 'modules.dep'), 'utf8');
  const needs = new Map<string, string[]>();
  const byName = new Map<string, string>();
  for (const line of dep.split('\n')) {
    const [module, rest] = line.split(':');
    if (!module || rest === undefined) continue;
    needs.set(module, rest.trim() === '' ? [] : rest.trim().split(/\s+/));
    byName.set(path.basename(module).replace(/\.ko(\.\w+)?$/, ''), module);
  }
  const order: string[] = [];
  const visit = (module: string) => {
    if (order.includes(module)) return;
    for (const dependency of needs.get(module) ?? []) visit(dependency);
    order.push(module);
  };
  for (const name of wanted) {
    const module = byName.get(name);
    if (module !== undefined) visit(module);
  }
  if (order.some((module) => /\.ko\.\w+$/.test(module))) {
    throw new AgentImageError(`${kernel.modules} has compressed modules, which busybox's insmod cannot load`);
  }
  return order;
}

/** The shared libraries `programs` load, by the paths the loader looks them up at (ldd's answer), sorted. */
export async function sharedLibraries(programs: readonly string[]): Promise<string[]> {
  const run = promisify(execFile);
  const found = new Set<string>();
  for (const program of programs) {
    const { stdout } = await run('ldd', [program]).catch((error: { stdout?: string }) => ({
      stdout: error.stdout ?? '',
    }));
    for (const line of stdout.split('\n')) {
      const match = /=>\s*(\/\S+)/.exec(line) ?? /^\s*(\/\S+)\s+\(0x/.exec(line);
      if (match?.[1]) found.add(match[1]);
    }
  }
  // Each goes in as a file at the path the loader asks for (a link on the host, such as the loader's own
  // /lib64/ld-linux-x86-64.so.2, is copied as the file it points to).
  return [...found].sort();
}
