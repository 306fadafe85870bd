/**
 * What an installation gives the installed OS for its first boot (its
 * hostname, the operator's SSH keys, its network), checked before it is
 * stored. The network is the model the agent reads (`@bmaas/api/network`),
 * checked here because its JSON comes from an operator.
 */
import { isIP } from 'node:net';
import type { NetworkConfig, NetworkRoute } from '@bmaas/api/network';
import { BMDBError } from '@bmaas/bmdb-controlloop';

export type { NetworkConfig };

/** First-boot settings that are not valid; `field` names the one at fault (`hostname`, `network`, …). */
export class FirstBootSettingError extends BMDBError {
  override name = 'FirstBootSettingError';
  constructor(
    readonly field: string,
    /** What is wrong with it, without the request named (for a caller's own message). */
    readonly detail: string,
    what: string,
  ) {
    super(`${what}: ${field}: ${detail}`);
  }
}

const HOSTNAME = /^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/i;
const KEY_TYPES = [
  'ssh-ed25519',
  'ssh-rsa',
  'ecdsa-sha2-nistp256',
  'ecdsa-sha2-nistp384',
  'ecdsa-sha2-nistp521',
  'sk-ssh-ed25519@openssh.com',
  'sk-ecdsa-sha2-nistp256@openssh.com',
];
const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const BOND_MODES = ['balance-rr', 'active-backup', 'balance-xor', 'broadcast', '802.3ad', 'balance-tlb', 'balance-alb'];

/** Whether `name` is a hostname (RFC 1123 labels, dots between). */
export function isHostname(name: string): boolean {
  return HOSTNAME.test(name);
}

/** @throws {@link FirstBootSettingError} unless `name` is a hostname */
export function checkHostname(name: unknown, what: string): string {
  if (typeof name !== 'string' || !isHostname(name)) {
    throw new FirstBootSettingError(
      'hostname',
      `${JSON.stringify(name)} is not a hostname (letters, digits and hyphens, dots between)`,
      what,
    );
  }
  return name;
}

/**
 * An OpenSSH public key as `authorized_keys` holds one (`type base64
 * [comment]`), trimmed: its type one OpenSSH knows, its blob naming that
 * type, one line.
 *
 * @throws {@link FirstBootSettingError} naming the key otherwise
 */
export function checkSshPublicKey(key: unknown, what: string): string {
  const line = typeof key === 'string' ? key.trim() : undefined;
  const [type = '', blob = ''] = line?.split(/\s+/) ?? [];
  const decoded = /^[A-Za-z0-9+/]+={0,2}$/.test(blob) ? Buffer.from(blob, 'base64') : Buffer.alloc(0);
  const named = decoded.length > 4 ? decoded.subarray(4, 4 + decoded.readUInt32BE(0)).toString('latin1') : '';
  if (line === undefined || line.includes('\n') || !KEY_TYPES.includes(type) || named !== type) {
    const shown = typeof key === 'string' && key.length > 40 ? `${key.slice(0, 40)}…` : key;
    throw new FirstBootSettingError(
      'ssh-key',
      `${JSON.stringify(shown)} is not an OpenSSH public key (ssh-ed25519 AAAA… comment)`,
      what,
    );
  }
  return line;
}

/**
 * Checks `value` as the installed OS's network and returns it with the
 * defaults filled in (no addresses, routes or DHCP; VLANs 802.1Q).
 *
 * @throws {@link FirstBootSettingError} (`network`) naming the interface and field at fault:
 *   an unknown kind or field, a MAC that is not lower-case hex pairs, an
 *   address without its prefix length, a bond or VLAN over an interface not listed
 */
export function checkNetworkConfig(value: unknown, what: string): NetworkConfig {
  const bad = (detail: string) => new FirstBootSettingError('network', detail, what);
  const config = objectOf(value, ['interfaces', 'nameservers'], 'the network', bad);
  const list = (items: unknown, name: string): unknown[] => {
    if (items === undefined) return [];
    if (!Array.isArray(items)) throw bad(`${name} is not a list`);
    return items;
  };
  const names = new Set<string>();
  const interfaces = list(config.interfaces, 'interfaces').map((item, index): NetworkConfig['interfaces'][number] => {
    const i = objectOf(
      item,
      ['kind', 'name', 'mtu', 'addresses', 'dhcp', 'routes', 'mac', 'mode', 'members', 'parent', 'id', 'protocol'],
      `interface ${index}`,
      bad,
    );
    const name = i.name;
    if (typeof name !== 'string' || !/^[^\s/:]{1,15}$/.test(name)) {
      throw bad(`interface ${index}: name ${JSON.stringify(name)} is not an interface name (1 to 15 characters)`);
    }
    if (names.has(name)) throw bad(`interface ${name} is listed twice`);
    names.add(name);
    const at = `interface ${name}`;
    if (i.mtu !== undefined && (!Number.isInteger(i.mtu) || (i.mtu as number) < 68 || (i.mtu as number) > 65535)) {
      throw bad(`${at}: mtu ${JSON.stringify(i.mtu)} is not a whole number from 68 to 65535`);
    }
    const addresses = list(i.addresses, `${at}: addresses`).map((address) => {
      if (!isPrefix(address, true))
        throw bad(`${at}: address ${JSON.stringify(address)} is not an IP address/prefix length`);
      return address as string;
    });
    if (i.dhcp !== undefined && typeof i.dhcp !== 'boolean')
      throw bad(`${at}: dhcp ${JSON.stringify(i.dhcp)} is not true or false`);
    const routes = list(i.routes, `${at}: routes`).map((item) => {
      const r = objectOf(item, ['destination', 'gateway', 'source', 'metric'], `${at}: a route`, bad);
      if (!isPrefix(r.destination, false))
        throw bad(`${at}: route destination ${JSON.stringify(r.destination)} is not a prefix`);
      for (const field of ['gateway', 'source'] as const) {
        if (r[field] !== undefined && (typeof r[field] !== 'string' || isIP(r[field]) === 0)) {
          throw bad(`${at}: route ${field} ${JSON.stringify(r[field])} is not an IP address`);
        }
      }
      if (r.metric !== undefined && (!Number.isInteger(r.metric) || (r.metric as number) < 0)) {
        throw bad(`${at}: route metric ${JSON.stringify(r.metric)} is not a whole number`);
      }
      return r as unknown as NetworkRoute;
    });
    const common = {
      name,
      ...(i.mtu !== undefined && { mtu: i.mtu as number }),
      addresses,
      dhcp: i.dhcp === true,
      routes,
    };
    const only = (kind: string, fields: readonly string[]) => {
      for (const field of ['mac', 'mode', 'members', 'parent', 'id', 'protocol']) {
        if (!fields.includes(field) && i[field] !== undefined) throw bad(`${at}: a ${kind} has no ${field}`);
      }
    };
    if (i.kind === 'device') {
      only('device', ['mac']);
      if (typeof i.mac !== 'string' || !MAC.test(i.mac)) {
        throw bad(
          `${at}: mac ${JSON.stringify(i.mac)} is not a MAC address in lower-case hex pairs (0c:c4:7a:00:00:01)`,
        );
      }
      return { kind: 'device' as const, ...common, mac: i.mac };
    }
    if (i.kind === 'bond') {
      only('bond', ['mode', 'members']);
      if (typeof i.mode !== 'string' || !BOND_MODES.includes(i.mode)) {
        throw bad(`${at}: mode ${JSON.stringify(i.mode)} is none of ${BOND_MODES.join(', ')}`);
      }
      const members = list(i.members, `${at}: members`);
      if (members.length === 0 || members.some((member) => typeof member !== 'string')) {
        throw bad(`${at}: members must name at least one interface`);
      }
      return { kind: 'bond' as const, ...common, mode: i.mode, members: members as string[] };
    }
    if (i.kind === 'vlan') {
      only('vlan', ['parent', 'id', 'protocol']);
      if (typeof i.parent !== 'string') throw bad(`${at}: parent ${JSON.stringify(i.parent)} is not an interface name`);
      if (!Number.isInteger(i.id) || (i.id as number) < 1 || (i.id as number) > 4094) {
        throw bad(`${at}: id ${JSON.stringify(i.id)} is not a VLAN ID from 1 to 4094`);
      }
      const protocol: unknown = i.protocol ?? '802.1Q';
      if (protocol !== '802.1Q' && protocol !== '802.1ad') {
        throw bad(`${at}: protocol ${JSON.stringify(protocol)} is neither 802.1Q nor 802.1ad`);
      }
      return { kind: 'vlan' as const, ...common, parent: i.parent, id: i.id as number, protocol };
    }
    throw bad(`${at}: kind ${JSON.stringify(i.kind)} is none of device, bond, vlan`);
  });
  for (const i of interfaces) {
    const under = i.kind === 'bond' ? i.members : i.kind === 'vlan' ? [i.parent] : [];
    for (const name of under) {
      if (!names.has(name)) throw bad(`interface ${i.name}: ${JSON.stringify(name)} is not among the interfaces`);
    }
  }
  const nameservers = list(config.nameservers, 'nameservers').map((server) => {
    if (typeof server !== 'string' || isIP(server) === 0)
      throw bad(`nameserver ${JSON.stringify(server)} is not an IP address`);
    return server;
  });
  return { interfaces, nameservers };
}

function objectOf(
  value: unknown,
  fields: readonly string[],
  name: string,
  bad: (detail: string) => Error,
): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw bad(`${name} is not an object`);
  const unknown = Object.keys(value).find((key) => !fields.includes(key));
  if (unknown !== undefined) throw bad(`${name}: unknown field ${JSON.stringify(unknown)}`);
  return value as Record<string, unknown>;
}

/** `192.0.2.10/24`: an address (or, `host` false, any prefix) with a prefix length its family allows. */
function isPrefix(value: unknown, host: boolean): boolean {
  if (typeof value !== 'string') return false;
  const [address = '', length = '', ...rest] = value.split('/');
  const family = isIP(address);
  return (
    rest.length === 0 &&
    family !== 0 &&
    /^\d{1,3}$/.test(length) &&
    Number(length) <= (family === 4 ? 32 : 128) &&
    (!host || Number(length) > 0)
  );
}
