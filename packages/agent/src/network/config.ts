import { BlockList, isIP } from 'node:net';

// The running OS's network configuration as the takeover hands it to the agent image (upstream's
// osbase/net/proto Net, reduced to what busybox can set up): interfaces keyed by MAC, not by name,
// since the agent image's kernel may name the NICs otherwise.

/** A route of one interface. */
export interface NetworkRoute {
  /** A prefix: `0.0.0.0/0`, `::/0`, `10.9.0.0/16`. */
  readonly destination: string;
  readonly gateway?: string;
  /** The preferred source address. */
  readonly source?: string;
  readonly metric?: number;
}

interface InterfaceCommon {
  /** Its name on the running OS (a bond's and a VLAN's name is kept; a NIC is found by its MAC). */
  readonly name: string;
  readonly mtu?: number;
  /** Static addresses with their prefix length (`192.0.2.10/24`, `2001:db8::10/64`). */
  readonly addresses: readonly string[];
  /** It had an IPv4 address leased by DHCP: the agent image asks DHCP on it too. */
  readonly dhcp: boolean;
  readonly routes: readonly NetworkRoute[];
}

/** A physical NIC, by its permanent MAC address (lower case). */
export interface DeviceInterface extends InterfaceCommon {
  readonly kind: 'device';
  readonly mac: string;
}

/** A Linux bond of other interfaces (by their names here). */
export interface BondInterface extends InterfaceCommon {
  readonly kind: 'bond';
  /** The bonding driver's mode name: `802.3ad`, `active-backup`, `balance-rr`, … */
  readonly mode: string;
  readonly members: readonly string[];
}

/** A VLAN on another interface (by its name here). */
export interface VlanInterface extends InterfaceCommon {
  readonly kind: 'vlan';
  readonly parent: string;
  readonly id: number;
  readonly protocol: '802.1Q' | '802.1ad';
}

export type NetworkInterface = DeviceInterface | BondInterface | VlanInterface;

/** What the takeover captured. */
export interface NetworkConfig {
  readonly interfaces: readonly NetworkInterface[];
  readonly nameservers: readonly string[];
}

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
