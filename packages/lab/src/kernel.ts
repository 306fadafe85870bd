import { accessSync, constants, existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { LabSetupError } from './errors.js';

/** Debian's kernel (`linux-image-amd64`) and its modules. */
export interface GuestKernel {
  readonly release: string;
  /** `/boot/vmlinuz-<release>`. */
  readonly image: string;
  /** `/lib/modules/<release>`. */
  readonly modules: string;
}

/**
 * The newest `/boot/vmlinuz-*` whose modules are installed too (the VMs load
 * virtio and 9p modules from it).
 *
 * @throws {@link LabSetupError} naming the package when there is none
 */
export function findKernel(boot = '/boot', modules = '/lib/modules'): GuestKernel {
  const releases = existsSync(boot)
    ? readdirSync(boot)
        .filter((name) => name.startsWith('vmlinuz-'))
        .map((name) => name.slice('vmlinuz-'.length))
        .filter((release) => existsSync(path.join(modules, release, 'modules.dep')))
        .sort(compareReleases)
    : [];
  const release = releases.at(-1);
  if (release === undefined) {
    throw new LabSetupError(
      `no kernel with its modules in ${boot} and ${modules}: install Debian's linux-image-amd64 package (apt-get install linux-image-amd64)`,
    );
  }
  const image = path.join(boot, `vmlinuz-${release}`);
  try {
    accessSync(image, constants.R_OK);
  } catch {
    throw new LabSetupError(
      `${image} is not readable by this user (some distributions make it 0600): run the lab as root, or chmod 644 it`,
    );
  }
  return { release, image, modules: path.join(modules, release) };
}

function compareReleases(a: string, b: string): number {
  return a.localeCompare(b, 'en', { numeric: true });
}
