import { copyFile, link, mkdir, realpath, rename, stat } from 'node:fs/promises';
import { createRequire } from 'node:module';
import path from 'node:path';
import { log } from './log.js';

/** What the guests share read-only at /opt/guest. */
export interface GuestShare {
  readonly dir: string;
  /** The agent the lab's shepherd uploads: a wrapper running the shared node on the shared test agent. */
  readonly agentWrapper: (heartbeatInterval: string) => string;
}

/**
 * The directory every VM mounts at `/opt/guest` over virtio-9p: this host's
 * node binary (hard-linked, or copied once where it lives on another file
 * system; its C++ runtime is in the initramfs) and the project's test agent,
 * a single file of node built-ins. Sharing node keeps the initramfs small:
 * a 100 MB binary copied into every boot would cost memory and time.
 */
export async function prepareGuestShare(cacheDir: string, nodeBinary = process.execPath): Promise<GuestShare> {
  const node = await realpath(nodeBinary);
  const s = await stat(node);
  const dir = path.join(cacheDir, `guest-${Math.round(s.mtimeMs)}-${s.size}`);
  await mkdir(dir, { recursive: true });
  const shared = path.join(dir, 'node');
  if (!(await stat(shared).catch(() => undefined))) {
    const temporary = `${shared}.${process.pid}.tmp`;
    await link(node, temporary).catch(() => copyFile(node, temporary));
    await rename(temporary, shared);
    log('guest share: node %s in %s', node, dir);
  }
  const agent = createRequire(import.meta.url).resolve('@bmaas/shepherd-manager/test-agent');
  await copyFile(agent, path.join(dir, 'test-agent.js'));
  return {
    dir,
    agentWrapper: (interval) =>
      `#!/bin/sh\n# The shepherd's test agent on the node shared from the lab's host; after installing an OS it reboots the VM.\nSHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL=${interval} SHEPHERD_TEST_AGENT_REBOOT_COMMAND='reboot -f' exec /opt/guest/node /opt/guest/test-agent.js "$@"\n`,
  };
}
