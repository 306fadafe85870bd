import type { NetworkConfig, NetworkInterface, NetworkRoute } from './config.js';
import { nameserversOf, usedInterfaces } from './config.js';

/** What iproute2 printed, as text: `ip -j -d link show`, `ip -j addr show`, `ip -j [-6] route show table main`. */
export interface IpOutput {
  readonly links: string;
  readonly addresses: string;
  readonly routes4: string;
  readonly routes6: string;
  /** `/etc/resolv.conf`, if any. */
  readonly resolvConf?: string | undefined;
  /** systemd-resolved's upstream servers (`/run/systemd/resolve/resolv.conf`), if any. */
  readonly upstreamResolvConf?: string | undefined;
}

interface IpLink {
  ifindex: number;
  ifname: string;
  link_type?: string;
  address?: string;
  permaddr?: string;
  mtu?: number;
  master?: string;
  link?: string;
  linkinfo?: {
    info_kind?: string;
    info_data?: { mode?: string; protocol?: string; id?: number };
    info_slave_kind?: string;
    info_slave_data?: { perm_hwaddr?: string };
  };
}

interface IpAddressLink {
  ifname: string;
  addr_info?: Array<{
    family: string;
    local: string;
    prefixlen: number;
    scope?: string;
    dynamic?: boolean;
    valid_life_time?: number;
  }>;
}

interface IpRoute {
  type?: string;
  dst: string;
  gateway?: string;
  dev?: string;
  protocol?: string;
  prefsrc?: string;
  metric?: number;
}

/** A lifetime of "forever" (iproute2 prints the kernel's INFINITY_LIFE_TIME). */
const FOREVER = 4294967295;
/** Routes somebody configured, as upstream keeps them (iproute2 names the kernel's rt_protos; boot prints none). */
const CONFIGURED = new Set([undefined, 'boot', 'static', 'unspec']);

/**
 * The network configuration `ip -j` describes: NICs by permanent MAC,
 * bonds with their mode and members, VLANs with their parent and ID; static
 * addresses (a dynamic IPv4 address, leased by DHCP, makes the interface ask
 * DHCP instead; a dynamic IPv6 one is SLAAC's, which the kernel does again);
 * the main table's routes somebody configured (not the kernel's own, not
 * DHCP's or router advertisements'), each on its interface; the
 * nameservers ({@link nameserversOf}: a loopback stub's upstream servers).
 *
 * @throws SyntaxError when an output is not iproute2's JSON
 */
export function networkFromIp(output: IpOutput): { config: NetworkConfig; warnings: string[] } {
  const links = JSON.parse(output.links) as IpLink[];
  const addressed = new Map((JSON.parse(output.addresses) as IpAddressLink[]).map((a) => [a.ifname, a]));
  const warnings: string[] = [];
  const byName = new Map<string, NetworkInterface>();
  const membersOf = new Map<string, string[]>();
  for (const link of links) {
    if (link.link_type === 'loopback') continue;
    const kind = link.linkinfo?.info_kind;
    const addresses: string[] = [];
    let dhcp = false;
    for (const a of addressed.get(link.ifname)?.addr_info ?? []) {
      if (a.scope === 'link' || a.scope === 'host') continue;
      const dynamic = a.dynamic === true || (a.valid_life_time !== undefined && a.valid_life_time < FOREVER);
      if (dynamic) {
        if (a.family === 'inet') dhcp = true;
        continue;
      }
      addresses.push(`${a.local}/${a.prefixlen}`);
    }
    const common = {
      name: link.ifname,
      ...(link.mtu !== undefined && { mtu: link.mtu }),
      addresses,
      dhcp,
      routes: [] as NetworkRoute[],
    };
    let found: NetworkInterface;
    if (kind === undefined && link.link_type === 'ether' && link.address) {
      const mac = link.linkinfo?.info_slave_data?.perm_hwaddr ?? link.permaddr ?? link.address;
      found = { ...common, kind: 'device', mac: mac.toLowerCase() };
    } else if (kind === 'bond') {
      found = { ...common, kind: 'bond', mode: link.linkinfo?.info_data?.mode ?? 'balance-rr', members: [] };
    } else if (kind === 'vlan' && link.link !== undefined && link.linkinfo?.info_data?.id !== undefined) {
      const protocol = link.linkinfo.info_data.protocol === '802.1ad' ? '802.1ad' : '802.1Q';
      found = { ...common, kind: 'vlan', parent: link.link, id: link.linkinfo.info_data.id, protocol };
    } else {
      if (addresses.length > 0 || dhcp) {
        warnings.push(
          `interface ${link.ifname} (${kind ?? link.link_type}) is not carried over: only NICs, bonds and VLANs are`,
        );
      }
      continue;
    }
    if (link.master !== undefined) membersOf.set(link.master, [...(membersOf.get(link.master) ?? []), link.ifname]);
    byName.set(link.ifname, found);
  }
  for (const [routes, family] of [
    [output.routes4, 4],
    [output.routes6, 6],
  ] as const) {
    for (const route of JSON.parse(routes) as IpRoute[]) {
      if (!CONFIGURED.has(route.protocol) || (route.type !== undefined && route.type !== 'unicast')) continue;
      const owner = route.dev === undefined ? undefined : byName.get(route.dev);
      if (owner === undefined) continue;
      const destination =
        route.dst === 'default'
          ? family === 4
            ? '0.0.0.0/0'
            : '::/0'
          : route.dst.includes('/')
            ? route.dst
            : `${route.dst}/${family === 4 ? 32 : 128}`;
      (owner.routes as NetworkRoute[]).push({
        destination,
        ...(route.gateway !== undefined && { gateway: route.gateway }),
        ...(route.prefsrc !== undefined && { source: route.prefsrc }),
        ...(route.metric !== undefined && { metric: route.metric }),
      });
    }
  }
  const interfaces = [...byName.values()].map((i) =>
    i.kind === 'bond' ? { ...i, members: membersOf.get(i.name) ?? [] } : i,
  );
  return {
    config: {
      interfaces: usedInterfaces(interfaces),
      nameservers: nameserversOf(output.resolvConf, output.upstreamResolvConf),
    },
    warnings,
  };
}
