import { isIP } from 'node:net';
import type { NetworkConfig, NetworkInterface, NetworkRoute } from '../network/config.js';

// OpenStack's network_data.json, as Nova and Ironic write it into a config drive and cloud-init's
// ConfigDrive source reads it (cloudinit/sources/helpers/openstack.py, convert_net_json).

/** A link: a NIC by its MAC, a bond of links, or a VLAN on a link. */
export type NetworkDataLink =
  | { readonly id: string; readonly type: 'phy'; readonly ethernet_mac_address: string; readonly mtu?: number }
  | {
      readonly id: string;
      readonly type: 'bond';
      readonly bond_links: readonly string[];
      readonly bond_mode: string;
      /** cloud-init reads it for every bond: its first member's MAC. */
      readonly ethernet_mac_address: string;
      readonly mtu?: number;
    }
  | {
      readonly id: string;
      readonly type: 'vlan';
      readonly vlan_link: string;
      readonly vlan_id: number;
      /** cloud-init reads it for every VLAN: its parent's MAC. */
      readonly vlan_mac_address: string;
      readonly mtu?: number;
    };

/** A route of a static network, as OpenStack spells one. */
export interface NetworkDataRoute {
  readonly network: string;
  readonly netmask: string;
  readonly gateway: string;
}

/** An address (or DHCP) on a link. */
export type NetworkDataNetwork =
  | { readonly id: string; readonly type: 'ipv4_dhcp' | 'ipv6_dhcp'; readonly link: string }
  | {
      readonly id: string;
      readonly type: 'ipv4' | 'ipv6';
      readonly link: string;
      readonly ip_address: string;
      readonly netmask: string;
      readonly routes: readonly NetworkDataRoute[];
    };

/** network_data.json. */
export interface NetworkData {
  readonly links: readonly NetworkDataLink[];
  readonly networks: readonly NetworkDataNetwork[];
  readonly services: readonly { readonly type: 'dns'; readonly address: string }[];
}

/** The network configuration names what cannot be written as network data. */
export class NetworkDataError extends Error {
  override name = 'NetworkDataError';
}

/**
 * The installed OS's network data: `config`'s interfaces (NICs by MAC,
 * bonds, VLANs, static addresses, routes with a gateway, DHCP where set)
 * and nameservers; without a config, DHCP (IPv4) on each NIC of `macs`.
 * A route without a gateway is left out: the address's own prefix is on
 * its link already.
 *
 * @throws {@link NetworkDataError} naming the interface of a bad address, or a bond or VLAN
 *   over an interface the config does not have
 */
export function networkData(config: NetworkConfig | undefined, macs: readonly string[]): NetworkData {
  if (config === undefined) {
    const links = macs.map((mac, i) => ({ id: `nic${i}`, type: 'phy' as const, ethernet_mac_address: mac }));
    return {
      links,
      networks: links.map((link, i) => ({ id: `network${i}`, type: 'ipv4_dhcp' as const, link: link.id })),
      services: [],
    };
  }
  const byName = new Map(config.interfaces.map((i) => [i.name, i]));
  const macOf = (name: string, seen: readonly string[] = []): string => {
    const found = byName.get(name);
    if (found === undefined || seen.includes(name)) {
      throw new NetworkDataError(`network: interface ${JSON.stringify(name)} is named but not configured`);
    }
    if (found.kind === 'device') return found.mac;
    const under = found.kind === 'bond' ? found.members[0] : found.parent;
    if (under === undefined) throw new NetworkDataError(`network: bond ${JSON.stringify(name)} has no members`);
    return macOf(under, [...seen, name]);
  };
  const links = config.interfaces.map((i): NetworkDataLink => {
    const mtu = i.mtu === undefined ? {} : { mtu: i.mtu };
    if (i.kind === 'device') return { id: i.name, type: 'phy', ethernet_mac_address: i.mac, ...mtu };
    if (i.kind === 'bond') {
      for (const member of i.members) macOf(member);
      return {
        id: i.name,
        type: 'bond',
        bond_links: i.members,
        bond_mode: i.mode,
        ethernet_mac_address: macOf(i.name),
        ...mtu,
      };
    }
    return {
      id: i.name,
      type: 'vlan',
      vlan_link: i.parent,
      vlan_id: i.id,
      vlan_mac_address: macOf(i.name),
      ...mtu,
    };
  });
  const networks: NetworkDataNetwork[] = [];
  for (const i of config.interfaces) networks.push(...networksOf(i, networks.length));
  return { links, networks, services: config.nameservers.map((address) => ({ type: 'dns', address })) };
}

function networksOf(i: NetworkInterface, numbered: number): NetworkDataNetwork[] {
  const networks: NetworkDataNetwork[] = [];
  const id = () => `network${numbered + networks.length}`;
  if (i.dhcp) networks.push({ id: id(), type: 'ipv4_dhcp', link: i.name });
  const routed = new Set<4 | 6>();
  for (const address of i.addresses) {
    const [ip = '', prefixText = ''] = address.split('/');
    const family = isIP(ip);
    const prefix = Number(prefixText);
    if ((family !== 4 && family !== 6) || !/^\d+$/.test(prefixText) || prefix > (family === 4 ? 32 : 128)) {
      throw new NetworkDataError(
        `network: interface ${i.name} address ${JSON.stringify(address)}: want an IP address and prefix length`,
      );
    }
    // Each family's routes go with its first address, where cloud-init looks for them.
    const routes = routed.has(family) ? [] : routesOf(i.routes, family);
    routed.add(family);
    networks.push({
      id: id(),
      type: family === 4 ? 'ipv4' : 'ipv6',
      link: i.name,
      ip_address: ip,
      netmask: netmask(family, prefix),
      routes,
    });
  }
  return networks;
}

function routesOf(routes: readonly NetworkRoute[], family: 4 | 6): NetworkDataRoute[] {
  return routes.flatMap((route) => {
    const [network = '', prefix = ''] = route.destination.split('/');
    if (route.gateway === undefined || isIP(network) !== family || isIP(route.gateway) !== family) return [];
    return [{ network, netmask: netmask(family, Number(prefix)), gateway: route.gateway }];
  });
}

/** A prefix length as a netmask: `255.255.255.0`, `ffff:ffff:ffff:ffff::`. */
export function netmask(family: 4 | 6, prefix: number): string {
  const bits = family === 4 ? 32 : 128;
  const mask = prefix === 0 ? 0n : ((1n << BigInt(prefix)) - 1n) << BigInt(bits - prefix);
  if (family === 4) return [24, 16, 8, 0].map((shift) => Number((mask >> BigInt(shift)) & 0xffn)).join('.');
  const groups = [];
  for (let shift = 112; shift >= 0; shift -= 16) groups.push(((mask >> BigInt(shift)) & 0xffffn).toString(16));
  // The zero groups at the end (there are only such) as `::`.
  const end = groups.indexOf('0');
  return end === -1 ? groups.join(':') : `${groups.slice(0, end).join(':')}::`;
}
