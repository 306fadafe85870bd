import { createWriteStream } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { get as httpGet, type IncomingMessage } from 'node:http';
import { get as httpsGet } from 'node:https';
import { pipeline } from 'node:stream/promises';
import { VmError } from './errors.js';

/**
 * The address the lab's VMs reach the host at (QEMU's user-mode network):
 * the shepherd names its boot files there, for the machines. The lab's BMCs
 * run on the host, where that is its loopback, as a real BMC reaches the
 * shepherd on the management network at an address of its own.
 */
const GUEST_HOST = '10.0.2.2';

/**
 * Downloads `url` (the image a BMC was told to insert) to `file`, as a BMC
 * does: over HTTPS without checking the certificate (BMCs mostly do not; the
 * shepherd's boot files are served with a self-signed one), a URL naming the
 * VMs' `10.0.2.2` fetched from the host's loopback. Written beside and
 * renamed, so a half-downloaded image is never what the CD drive holds.
 */
export async function downloadMedia(vm: string, url: string, file: string): Promise<void> {
  const target = new URL(url);
  if (target.hostname === GUEST_HOST) target.hostname = '127.0.0.1';
  const partial = `${file}.part`;
  try {
    const response = await new Promise<IncomingMessage>((resolve, reject) => {
      const request =
        target.protocol === 'https:'
          ? httpsGet(target, { rejectUnauthorized: false }, resolve)
          : httpGet(target, resolve);
      request.once('error', reject);
    });
    if (response.statusCode !== 200) {
      response.resume();
      throw new VmError(vm, `virtual media ${url}: HTTP ${response.statusCode}`);
    }
    await pipeline(response, createWriteStream(partial, { mode: 0o600 }));
    await rename(partial, file);
  } catch (error) {
    await rm(partial, { force: true });
    throw error instanceof VmError ? error : new VmError(vm, `virtual media ${url} not downloaded`, { cause: error });
  }
}
