import { exists, linkName, listNames, readInteger, readText } from './files.js';

/** One physical network interface, from /sys/class/net. */
export interface NicRecord {
  /** The kernel's name: eth0, enp1s0f0. */
  readonly name: string;
  /**
   * Its own MAC address, lower-case and colon-separated: for a bond's member,
   * the permanent one (a bond gives its members its own address).
   */
  readonly mac: string;
  /** The kernel driver bound to it (e1000e, mlx5_core), or '' when none is. */
  readonly driver: string;
  /** Whether it has a link (carrier). */
  readonly linkUp: boolean;
  /** The negotiated speed in Mb/s; undefined while the link is down or the driver does not tell. */
  readonly speedMbps?: number;
  /** The bond it is a member of, if any. */
  readonly bond?: string;
}

/**
 * The machine's physical interfaces: those backed by a device (so not lo,
 * bonds, bridges, VLANs or tunnels), in name order.
 */
export async function readNics(root: string): Promise<NicRecord[]> {
  const nics: NicRecord[] = [];
  for (const name of await listNames(root, 'sys/class/net')) {
    const dir = `sys/class/net/${name}`;
    if (!(await exists(root, `${dir}/device`))) continue;
    const bond = (await exists(root, `${dir}/bonding_slave`)) ? await linkName(root, `${dir}/master`) : undefined;
    const permanent = bond === undefined ? undefined : await readText(root, `${dir}/bonding_slave/perm_hwaddr`);
    const mac = (permanent ?? (await readText(root, `${dir}/address`)) ?? '').toLowerCase();
    const linkUp = (await readText(root, `${dir}/carrier`)) === '1';
    const speed = linkUp ? await readInteger(root, `${dir}/speed`) : undefined;
    nics.push({
      name,
      mac,
      driver: (await linkName(root, `${dir}/device/driver`)) ?? '',
      linkUp,
      // The kernel reports -1 (or SPEED_UNKNOWN as 4294967295) when it does not know.
      ...(speed !== undefined && speed > 0 && speed < 2 ** 31 && { speedMbps: speed }),
      ...(bond !== undefined && { bond }),
    });
  }
  return nics;
}
