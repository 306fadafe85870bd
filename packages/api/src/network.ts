/**
 * The network model the agent and the shepherd exchange as JSON: the takeover's
 * capture of the running OS's network (the agent image's `/etc/bmaas/network.json`)
 * and an OS installation's network for the installed OS (`DiskImageRequest.network_json`
 * in `proto/cloud/agent/api/disk_image.proto`, written as the config drive's
 * `network_data.json`). Upstream's osbase/net/proto Net, reduced to what busybox
 * can set up. Interfaces are keyed by MAC, not by name, since another kernel
 * may name the NICs otherwise. Written by hand: the JSON has no `.proto`.
 */

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
  /** DHCP (IPv4) on it: the capture found a leased address, or the installation asks for it. */
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

/** A machine's network: its interfaces (NICs by MAC, bonds, VLANs) and nameservers. */
export interface NetworkConfig {
  readonly interfaces: readonly NetworkInterface[];
  readonly nameservers: readonly string[];
}
