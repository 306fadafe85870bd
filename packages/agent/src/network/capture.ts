import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readText } from '../hardware/files.js';
import type { CapturedNetwork } from './config.js';
import { networkFromIp } from './from-ip.js';
import { networkFromProcfs } from './from-procfs.js';

/**
 * The running OS's network configuration, for the agent image to bring up
 * again after the kexec: from iproute2's `ip -j` where it is (`ip` on the
 * PATH and answering JSON), else from sysfs and procfs under `root`
 * ({@link networkFromProcfs}). `ip` reads the running kernel, so it is
 * asked only when `root` is `/`.
 */
export async function captureNetwork(root = '/'): Promise<CapturedNetwork> {
  const warnings: string[] = [];
  if (root === '/') {
    try {
      const ip = async (...args: string[]) => (await promisify(execFile)('ip', ['-j', ...args])).stdout;
      const { config, warnings: found } = networkFromIp({
        links: await ip('-d', 'link', 'show'),
        addresses: await ip('addr', 'show'),
        routes4: await ip('-4', 'route', 'show', 'table', 'main'),
        routes6: await ip('-6', 'route', 'show', 'table', 'main'),
        resolvConf: await readText(root, 'etc/resolv.conf'),
        upstreamResolvConf: await readText(root, 'run/systemd/resolve/resolv.conf'),
      });
      return { config, source: 'ip', warnings: found };
    } catch (error) {
      // busybox's ip and iproute2 before 4.13 have no JSON; either way procfs has the same.
      warnings.push(`ip -j could not be read (${(error as Error).message.split('\n')[0]}): read from sysfs and procfs`);
    }
  }
  const { config, warnings: found } = await networkFromProcfs(root);
  return { config, source: 'procfs', warnings: [...warnings, ...found] };
}
