/** How a target is named in messages and keyed in the host key pin store. */
import { isIPv6 } from 'node:net';
import type { SshTarget } from '../ssh-client.js';

function hostPort({ host, port }: SshTarget): string {
  return isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`;
}

/** Key of a target's host key pin: its machine ID, else where it listens. */
export function pinKey(target: SshTarget): string {
  return target.machineId ?? hostPort(target);
}

export function describeTarget(target: SshTarget): string {
  return target.machineId ? `machine ${target.machineId} at ${hostPort(target)}` : hostPort(target);
}
