import { exists, listNames, readInteger, readText } from '../hardware/files.js';
import type { NetworkConfig, NetworkInterface, NetworkRoute } from './config.js';
import { nameserversOf, usedInterfaces } from './config.js';

// /proc/net/route's and ipv6_route's flags (linux/route.h, linux/ipv6_route.h).
const RTF_UP = 0x1;
const RTF_GATEWAY = 0x2;
const RTF_DEFAULT = 0x10000;
const RTF_ADDRCONF = 0x40000;
const RTF_EXPIRES = 0x400000;
/** /proc/net/if_inet6's flags and scopes. */
const IFA_F_PERMANENT = 0x80;
const SCOPE_GLOBAL = 0x00;

/**
 * The network configuration as sysfs and procfs show it under `root`, where
 * no iproute2 with JSON output is (busybox's `ip` has none): NICs (a
 * `device`), bonds (`bonding/`), VLANs (`/proc/net/vlan/config`); IPv4
 * addresses from `/proc/net/fib_trie` (each local address, its prefix and
 * interface from the link route of `/proc/net/route` that holds it), IPv4
 * routes from `/proc/net/route`, IPv6 addresses from `/proc/net/if_inet6`
 * (permanent ones; the rest are SLAAC's) and routes with a gateway from
 * `/proc/net/ipv6_route` (not those router advertisements made).
 * procfs does not tell a DHCP lease from a static address: every IPv4
 * address is handed over as static, and a warning says so.
 */
export async function networkFromProcfs(root: string): Promise<{ config: NetworkConfig; warnings: string[] }> {
  const warnings: string[] = [];
  const byName = new Map<string, NetworkInterface>();
  const vlans = vlanTable(await readText(root, 'proc/net/vlan/config'));
  for (const name of await listNames(root, 'sys/class/net')) {
    const dir = `sys/class/net/${name}`;
    const mtu = await readInteger(root, `${dir}/mtu`);
    const common = { name, ...(mtu !== undefined && { mtu }), addresses: [], dhcp: false, routes: [] };
    const vlan = vlans.get(name);
    if (await exists(root, `${dir}/bonding`)) {
      const mode = ((await readText(root, `${dir}/bonding/mode`)) ?? 'balance-rr').split(/\s+/)[0] ?? 'balance-rr';
      const members = ((await readText(root, `${dir}/bonding/slaves`)) ?? '').split(/\s+/).filter((m) => m !== '');
      byName.set(name, { ...common, kind: 'bond', mode, members });
    } else if (vlan !== undefined) {
      byName.set(name, { ...common, kind: 'vlan', parent: vlan.parent, id: vlan.id, protocol: '802.1Q' });
    } else if (await exists(root, `${dir}/device`)) {
      const mac =
        (await readText(root, `${dir}/bonding_slave/perm_hwaddr`)) ?? (await readText(root, `${dir}/address`)) ?? '';
      byName.set(name, { ...common, kind: 'device', mac: mac.toLowerCase() });
    }
  }
  const add = (name: string, what: 'addresses' | 'routes', value: string | NetworkRoute) => {
    const owner = byName.get(name);
    if (owner !== undefined) (owner[what] as Array<typeof value>).push(value);
  };

  const routes4 = routeTable(await readText(root, 'proc/net/route'));
  const local = localAddresses(await readText(root, 'proc/net/fib_trie'));
  const connected = new Set<string>();
  for (const address of local) {
    const link = routes4
      .filter((r) => (r.flags & RTF_GATEWAY) === 0 && r.prefix > 0 && contains(r.destination, r.prefix, address))
      .sort((a, b) => b.prefix - a.prefix)[0];
    if (link === undefined) {
      warnings.push(
        `address ${address} has no link route in /proc/net/route: its interface and prefix are unknown, not carried over`,
      );
      continue;
    }
    connected.add(`${link.iface} ${link.destination}/${link.prefix}`);
    add(link.iface, 'addresses', `${address}/${link.prefix}`);
  }
  for (const r of routes4) {
    if ((r.flags & RTF_UP) === 0) continue;
    const gateway = (r.flags & RTF_GATEWAY) !== 0;
    if (!gateway && connected.has(`${r.iface} ${r.destination}/${r.prefix}`)) continue;
    add(r.iface, 'routes', {
      destination: `${r.destination}/${r.prefix}`,
      ...(gateway && { gateway: r.gateway }),
      ...(r.metric > 0 && { metric: r.metric }),
    });
  }
  for (const line of lines(await readText(root, 'proc/net/if_inet6'))) {
    const [hex, , prefix, scope, flags, name] = line.split(/\s+/);
    if (!hex || !prefix || !scope || !flags || !name) continue;
    if (Number.parseInt(scope, 16) !== SCOPE_GLOBAL || (Number.parseInt(flags, 16) & IFA_F_PERMANENT) === 0) continue;
    add(name, 'addresses', `${ipv6(hex)}/${Number.parseInt(prefix, 16)}`);
  }
  for (const line of lines(await readText(root, 'proc/net/ipv6_route'))) {
    const [dst, dstPrefix, , , nextHop, metric, , , flagsHex, name] = line.split(/\s+/);
    if (!dst || !dstPrefix || !nextHop || !metric || !flagsHex || !name) continue;
    const flags = Number.parseInt(flagsHex, 16);
    if ((flags & RTF_UP) === 0 || (flags & RTF_GATEWAY) === 0) continue;
    // Learned from router advertisements: the agent image's kernel learns them again.
    if ((flags & (RTF_ADDRCONF | RTF_DEFAULT | RTF_EXPIRES)) !== 0) continue;
    add(name, 'routes', {
      destination: `${ipv6(dst)}/${Number.parseInt(dstPrefix, 16)}`,
      gateway: ipv6(nextHop),
      metric: Number.parseInt(metric, 16),
    });
  }
  if (local.length > 0) {
    warnings.push(
      'read from procfs, which does not tell a DHCP lease from a static address: IPv4 addresses handed over as static',
    );
  }
  return {
    config: {
      interfaces: usedInterfaces([...byName.values()]),
      nameservers: nameserversOf(
        await readText(root, 'etc/resolv.conf'),
        await readText(root, 'run/systemd/resolve/resolv.conf'),
      ),
    },
    warnings,
  };
}

interface Route4 {
  iface: string;
  destination: string;
  gateway: string;
  flags: number;
  metric: number;
  prefix: number;
}

function routeTable(text: string | undefined): Route4[] {
  return lines(text)
    .slice(1)
    .flatMap((line) => {
      const [iface, destination, gateway, flags, , , metric, mask] = line.split(/\s+/);
      if (!iface || !destination || !gateway || !flags || !metric || !mask) return [];
      return [
        {
          iface,
          destination: ipv4(destination),
          gateway: ipv4(gateway),
          flags: Number.parseInt(flags, 16),
          metric: Number.parseInt(metric, 10),
          prefix: prefixLength(ipv4(mask)),
        },
      ];
    });
}

/** The local (`/32 host LOCAL`) addresses of fib_trie's tables, loopback's left out. */
function localAddresses(text: string | undefined): string[] {
  const found = new Set<string>();
  let last: string | undefined;
  for (const line of lines(text)) {
    const leaf = /^[\s|]*\|-- (\d+\.\d+\.\d+\.\d+)$/.exec(line);
    if (leaf?.[1]) {
      last = leaf[1];
      continue;
    }
    if (last !== undefined && /^\s*\/32 host LOCAL$/.test(line) && !last.startsWith('127.')) found.add(last);
  }
  return [...found];
}

function vlanTable(text: string | undefined): Map<string, { parent: string; id: number }> {
  const table = new Map<string, { parent: string; id: number }>();
  for (const line of lines(text)) {
    const [name, id, parent] = line.split('|').map((field) => field.trim());
    if (name && parent && id && /^\d+$/.test(id)) table.set(name, { parent, id: Number(id) });
  }
  return table;
}

function lines(text: string | undefined): string[] {
  return (text ?? '').split('\n').filter((line) => line.trim() !== '');
}

/** /proc/net/route's address: the kernel's 32 bits in host (little-endian) order, in hex. */
function ipv4(hex: string): string {
  const bytes = hex.match(/../g) ?? [];
  return bytes
    .reverse()
    .map((b) => Number.parseInt(b, 16))
    .join('.');
}

/** 32 hex digits as an IPv6 address in its shortest form. */
function ipv6(hex: string): string {
  const groups = hex.match(/.{4}/g) ?? [];
  return new URL(`http://[${groups.join(':')}]`).hostname.slice(1, -1);
}

function prefixLength(mask: string): number {
  return mask.split('.').reduce((bits, octet) => bits + (Number(octet).toString(2).match(/1/g)?.length ?? 0), 0);
}

function contains(network: string, prefix: number, address: string): boolean {
  const value = (a: string) => a.split('.').reduce((n, octet) => n * 256 + Number(octet), 0);
  const size = 2 ** (32 - prefix);
  return Math.floor(value(address) / size) === Math.floor(value(network) / size);
}
