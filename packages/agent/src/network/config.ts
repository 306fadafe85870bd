import { BlockList, isIP } from 'node:net';

import type { NetworkConfig, NetworkInterface } from '@bmaas/api/network';

// The running OS's network configuration as the takeover hands it to the agent image, in the model
// the agent and the shepherd share (@bmaas/api/network).
export type {
  BondInterface,
  DeviceInterface,
  NetworkConfig,
  NetworkInterface,
  NetworkRoute,
  VlanInterface,
} from '@bmaas/api/network';

/** A capture and what it could not carry over. */
export interface CapturedNetwork {
  readonly config: NetworkConfig;
  /** Where it was read from: `ip -j` (iproute2) or sysfs and procfs. */
  readonly source: 'ip' | 'procfs';
  readonly warnings: readonly string[];
}

/**
 * The nameservers the OS resolves through: those of its `/etc/resolv.conf`,
 * each loopback stub there (systemd-resolved's 127.0.0.53, a local cache's
 * 127.0.0.1 or ::1) replaced by the upstream servers of `upstreamResolvConf`
 * (systemd-resolved's `/run/systemd/resolve/resolv.conf`). A stub with no
 * upstream servers stays: {@link networkSteps} leaves it out of the agent
 * image, saying so.
 */
export function nameserversOf(resolvConf: string | undefined, upstreamResolvConf?: string | undefined): string[] {
  const upstream = serversOf(upstreamResolvConf).filter((server) => !isLoopback(server));
  const servers = serversOf(resolvConf).flatMap((server) =>
    isLoopback(server) && upstream.length > 0 ? upstream : [server],
  );
  return [...new Set(servers)];
}

function serversOf(resolvConf: string | undefined): string[] {
  const servers: string[] = [];
  for (const line of (resolvConf ?? '').split('\n')) {
    const match = /^\s*nameserver\s+(\S+)/.exec(line);
    if (match?.[1]) servers.push(match[1]);
  }
  return servers;
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** A loopback address: a resolver there is the OS's own, which the agent image does not run. */
export function isLoopback(address: string): boolean {
  const family = isIP(address);
  return family !== 0 && LOOPBACK.check(address, family === 4 ? 'ipv4' : 'ipv6');
}

/**
 * Drops the NICs nothing is configured on and nothing depends on, as
 * upstream does: a NIC without addresses, DHCP, bond or VLAN is left to the
 * image's DHCP. The rest sorted by name, for a stable hand-over.
 */
export function usedInterfaces(interfaces: readonly NetworkInterface[]): NetworkInterface[] {
  const needed = new Set<string>();
  for (const i of interfaces) {
    if (i.kind === 'bond') for (const member of i.members) needed.add(member);
    if (i.kind === 'vlan') needed.add(i.parent);
  }
  return interfaces
    .filter((i) => i.kind !== 'device' || i.addresses.length > 0 || i.dhcp || i.routes.length > 0 || needed.has(i.name))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}
