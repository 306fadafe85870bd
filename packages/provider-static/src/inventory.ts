import { readFile, stat } from 'node:fs/promises';
import { isIP } from 'node:net';
import path from 'node:path';
import { redactUrl } from '@bmaas/bmdb-controlloop';
import {
  type AgentBootMethod,
  checkHostname,
  checkNetworkConfig,
  checkSshPublicKey,
  FirstBootSettingError,
  type NetworkConfig,
} from '@bmaas/bmdb-model';
import { describeError, Secret } from '@bmaas/common';
import { InventoryError } from './errors.js';
import { IPMI_DEFAULT_CIPHER_SUITE, IPMI_DEFAULT_PORT } from './ipmi/target.js';

/** How a machine's BMC password is had: in the inventory itself, or in a file read at each reset. */
export type BmcPassword =
  | { readonly kind: 'inline'; readonly password: Secret }
  | { readonly kind: 'file'; readonly path: string };

/** A machine's BMC, as the inventory gives it: Redfish (the default) or IPMI. */
export type InventoryBmc = InventoryRedfishBmc | InventoryIpmiBmc;

/** A BMC spoken to over Redfish: `"bmc": { "url": … }`. */
export interface InventoryRedfishBmc {
  readonly protocol: 'redfish';
  /** The Redfish ComputerSystem resource, `http(s)://…/redfish/v1/Systems/<id>`. */
  readonly url: string;
  /** User name; `undefined`: the fleet-wide default (`--redfish-username`, or `--ipmi-username` for IPMI). */
  readonly username: string | undefined;
  /** Secret; `undefined`: the fleet-wide default (`--redfish-password-file`, or `--ipmi-password-file` for IPMI). */
  readonly password: BmcPassword | undefined;
  /** Skip TLS verification for this BMC (logged once per machine). */
  readonly insecure: boolean;
}

/** A BMC spoken to over IPMI 2.0 (RMCP+, `ipmitool -I lanplus`): `"bmc": { "protocol": "ipmi", "host": … }`. */
export interface InventoryIpmiBmc {
  readonly protocol: 'ipmi';
  /** The BMC's IP literal or host name. */
  readonly host: string;
  /** RMCP+ UDP port; 623 unless given. */
  readonly port: number;
  /** User name; `undefined`: the fleet-wide default. */
  readonly username: string | undefined;
  /** Secret; `undefined`: the fleet-wide default. */
  readonly password: BmcPassword | undefined;
  /** RMCP+ cipher suite (`ipmitool -C`); 17 unless given. */
  readonly cipherSuite: number;
}

/** The firmware's boot mode, for a boot override that must name it. */
export type InventoryBootMode = 'uefi' | 'legacy';

/** One machine of the inventory. */
export interface InventoryMachine {
  /** Provider ID, unique in the inventory. */
  readonly id: string;
  /**
   * IPv4 or IPv6 literal the shepherd reaches the machine at over SSH.
   * Required when the agent arrives over SSH; a machine whose BMC boots
   * its agent may leave it out.
   */
  readonly address: string | undefined;
  readonly location: string | undefined;
  readonly bmc: InventoryBmc | undefined;
  /** How the machine's agent arrives (`agentBoot`): `ssh` unless given. */
  readonly agentBoot: AgentBootMethod;
  /** The machine's NIC MACs (`macs`), lower case and colon-separated; empty when not given. */
  readonly macs: readonly string[];
  /**
   * `bootMode`: the firmware's boot mode, for the one-time boot override.
   * `undefined`: a Redfish BMC's own current mode, and UEFI over IPMI.
   */
  readonly bootMode: InventoryBootMode | undefined;
  /** `hostname`: the installed OS's hostname (`shepherd install`); undefined: its id. */
  readonly hostname: string | undefined;
  /** `sshPublicKeys`: OpenSSH public keys the installed OS lets in (`shepherd install`); undefined when not given. */
  readonly sshPublicKeys: readonly string[] | undefined;
  /** `network`: the installed OS's network (`shepherd install`); undefined: DHCP on each NIC. */
  readonly network: NetworkConfig | undefined;
}

const MACHINE_KEYS = [
  'id',
  'address',
  'location',
  'bmc',
  'agentBoot',
  'macs',
  'bootMode',
  'hostname',
  'sshPublicKeys',
  'network',
] as const;
/** Ways a machine's agent arrives; `ssh` when `agentBoot` is left out. */
const AGENT_BOOT_METHODS: readonly AgentBootMethod[] = ['ssh', 'virtual-media', 'network'];
const BOOT_MODES: readonly InventoryBootMode[] = ['uefi', 'legacy'];
/** A MAC address: six hex pairs separated by colons or hyphens. */
const MAC = /^[0-9a-f]{2}([:-])[0-9a-f]{2}(?:\1[0-9a-f]{2}){4}$/i;
/** The upstream Go shepherd's "mini" device list. */
const MINI_KEYS = { ID: 'id', Addr: 'address', Location: 'location' } as const;
const BMC_KEYS = ['protocol', 'url', 'username', 'password', 'passwordFile', 'insecure'] as const;
const IPMI_BMC_KEYS = ['protocol', 'host', 'port', 'username', 'password', 'passwordFile', 'cipherSuite'] as const;
/** BMC protocols of the inventory; Redfish when `protocol` is left out. */
const BMC_PROTOCOLS = ['redfish', 'ipmi'] as const;
/** Longest inventory read over HTTP: far more than any fleet needs, far less than memory. */
const MAX_INVENTORY_BYTES = 16 * 1024 * 1024;

/**
 * Parses and checks an inventory's text: a JSON array of machines. Either
 * the shepherd's own keys (`id`, `address`, `location`, `bmc`, `agentBoot`,
 * `macs`, `bootMode`, and for `shepherd install` `hostname`,
 * `sshPublicKeys`, `network`) or the
 * upstream mini device list's (`ID`, `Addr`, `Location`) per entry.
 *
 * @param source - the file or URL the text came from, named in errors
 * @throws {@link InventoryError} naming the source, the entry (index and
 *   `id`) and the field of the first problem
 */
export function parseInventory(text: string, source: string): InventoryMachine[] {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new InventoryError(source, {}, `not JSON (${describeError(error)})`);
  }
  if (!Array.isArray(data)) {
    throw new InventoryError(source, {}, `want a JSON array of machines, got ${kindOf(data)}`);
  }
  const machines: InventoryMachine[] = [];
  const byId = new Map<string, number>();
  const byAddress = new Map<string, number>();
  const byMac = new Map<string, number>();
  data.forEach((entry: unknown, index) => {
    const machine = parseMachine(entry, source, index);
    const fail = (field: string, problem: string) =>
      new InventoryError(source, { index, id: machine.id, field }, problem);
    const sameId = byId.get(machine.id);
    if (sameId !== undefined) throw fail('id', `duplicate id: entry ${sameId} has it too`);
    if (machine.address !== undefined) {
      const sameAddress = byAddress.get(machine.address);
      if (sameAddress !== undefined) {
        throw fail('address', `duplicate address ${machine.address}: entry ${sameAddress} has it too`);
      }
      byAddress.set(machine.address, index);
    }
    // A network boot finds the machine by the MAC it boots from: one MAC, one machine.
    machine.macs.forEach((mac, i) => {
      const sameMac = byMac.get(mac);
      if (sameMac !== undefined) {
        throw fail(`macs[${i}]`, `duplicate MAC ${mac}: entry ${sameMac} has it too`);
      }
      byMac.set(mac, index);
    });
    byId.set(machine.id, index);
    machines.push(machine);
  });
  return machines;
}

function parseMachine(entry: unknown, source: string, index: number): InventoryMachine {
  if (!isRecord(entry)) throw new InventoryError(source, { index }, `want an object, got ${kindOf(entry)}`);
  // The id first, so every later message can name it.
  const idKey = pickKey(entry, 'id', 'ID', source, index);
  const rawId = idKey === undefined ? undefined : entry[idKey];
  const id = typeof rawId === 'string' ? rawId : undefined;
  const fail = (field: string, problem: string) => new InventoryError(source, { index, id, field }, problem);

  for (const key of Object.keys(entry)) {
    if (!(MACHINE_KEYS as readonly string[]).includes(key) && !(key in MINI_KEYS)) {
      throw fail(
        key,
        `unknown key (want ${MACHINE_KEYS.join(', ')}; or the mini list's ${Object.keys(MINI_KEYS).join(', ')})`,
      );
    }
  }
  if (idKey === undefined) throw fail('id', 'missing');
  if (id === undefined) throw fail(idKey, `want a string, got ${kindOf(rawId)}`);
  if (id === '' || id.trim() !== id || /[\s\p{Cc}]/u.test(id)) {
    throw fail(idKey, `want a non-empty id without spaces or control characters, got ${JSON.stringify(id)}`);
  }

  const agentBoot = entry.agentBoot ?? 'ssh';
  if (!(AGENT_BOOT_METHODS as readonly unknown[]).includes(agentBoot)) {
    throw fail('agentBoot', `want one of ${AGENT_BOOT_METHODS.join(', ')} (ssh when left out), got ${show(agentBoot)}`);
  }
  const method = agentBoot as AgentBootMethod;

  const addressKey = pickKey(entry, 'address', 'Addr', source, index, id);
  if (addressKey === undefined && method === 'ssh') {
    throw fail(
      'address',
      'missing (the agent arrives over SSH, agentBoot ssh: the shepherd needs the address to reach it)',
    );
  }
  const address = addressKey === undefined ? undefined : entry[addressKey];
  if (addressKey !== undefined && (typeof address !== 'string' || isIP(address) === 0)) {
    throw fail(addressKey, `want an IPv4 or IPv6 literal, got ${show(address)}`);
  }

  const locationKey = pickKey(entry, 'location', 'Location', source, index, id);
  const location = locationKey === undefined ? undefined : entry[locationKey];
  if (location !== undefined && typeof location !== 'string') {
    throw fail(locationKey ?? 'location', `want a string, got ${kindOf(location)}`);
  }

  const bmc =
    entry.bmc === undefined ? undefined : parseBmc(entry.bmc, (field, problem) => fail(`bmc.${field}`, problem));
  const macs = parseMacs(entry.macs, fail);
  const { bootMode } = entry;
  if (bootMode !== undefined && !(BOOT_MODES as readonly unknown[]).includes(bootMode)) {
    throw fail('bootMode', `want one of ${BOOT_MODES.join(', ')}, got ${show(bootMode)}`);
  }
  if (method === 'virtual-media' && bmc?.protocol !== 'redfish') {
    throw fail(
      'agentBoot',
      `virtual-media needs a Redfish BMC (bmc with a url), got ${bmc === undefined ? 'no bmc' : 'an IPMI bmc; use network'}`,
    );
  }
  if (method === 'network') {
    if (bmc === undefined) throw fail('agentBoot', 'network needs a bmc (Redfish or IPMI) to set the boot device');
    if (macs.length === 0) throw fail('macs', 'missing: a network boot needs the MAC of at least one of its NICs');
  }
  return {
    id,
    address: address as string | undefined,
    location: location === '' ? undefined : location,
    bmc,
    agentBoot: method,
    macs,
    bootMode: bootMode as InventoryBootMode | undefined,
    ...firstBootOf(entry, fail),
  };
}

/** `hostname`, `sshPublicKeys` and `network`: what `shepherd install` gives the installed OS, checked by the library's rules. */
function firstBootOf(
  entry: Record<string, unknown>,
  fail: (field: string, problem: string) => InventoryError,
): Pick<InventoryMachine, 'hostname' | 'sshPublicKeys' | 'network'> {
  const checked = <T>(field: string, check: () => T): T => {
    try {
      return check();
    } catch (error) {
      if (error instanceof FirstBootSettingError) throw fail(field, error.detail);
      throw error;
    }
  };
  const { hostname, sshPublicKeys, network } = entry;
  if (sshPublicKeys !== undefined && !Array.isArray(sshPublicKeys)) {
    throw fail('sshPublicKeys', `want an array of OpenSSH public keys, got ${kindOf(sshPublicKeys)}`);
  }
  return {
    hostname: hostname === undefined ? undefined : checked('hostname', () => checkHostname(hostname, '')),
    sshPublicKeys: sshPublicKeys?.map((key: unknown, i: number) =>
      checked(`sshPublicKeys[${i}]`, () => checkSshPublicKey(key, '')),
    ),
    network: network === undefined ? undefined : checked('network', () => checkNetworkConfig(network, '')),
  };
}

/** `macs`: MAC addresses, lower-cased and colon-separated. */
function parseMacs(value: unknown, fail: (field: string, problem: string) => InventoryError): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw fail('macs', `want an array of MAC addresses, got ${kindOf(value)}`);
  const macs: string[] = [];
  value.forEach((mac: unknown, i) => {
    if (typeof mac !== 'string' || !MAC.test(mac)) {
      throw fail(`macs[${i}]`, `want a MAC address like "aa:bb:cc:dd:ee:ff", got ${show(mac)}`);
    }
    const normal = mac.toLowerCase().replaceAll('-', ':');
    if (macs.includes(normal)) throw fail(`macs[${i}]`, `duplicate MAC ${normal}`);
    macs.push(normal);
  });
  return macs;
}

/** The one of two spellings of a key the entry uses; both at once is an error. */
function pickKey(
  entry: Record<string, unknown>,
  own: string,
  mini: string,
  source: string,
  index: number,
  id?: string,
): string | undefined {
  const hasOwn = Object.hasOwn(entry, own);
  const hasMini = Object.hasOwn(entry, mini);
  if (hasOwn && hasMini) {
    throw new InventoryError(source, { index, id, field: own }, `both ${own} and ${mini} given; use one`);
  }
  return hasOwn ? own : hasMini ? mini : undefined;
}

function parseBmc(value: unknown, fail: (field: string, problem: string) => InventoryError): InventoryBmc {
  if (!isRecord(value)) throw fail('', `want an object, got ${kindOf(value)}`);
  const { protocol } = value;
  if (protocol !== undefined && !(BMC_PROTOCOLS as readonly unknown[]).includes(protocol)) {
    throw fail('protocol', `want one of ${BMC_PROTOCOLS.join(', ')} (redfish when left out), got ${show(protocol)}`);
  }
  return protocol === 'ipmi' ? parseIpmiBmc(value, fail) : parseRedfishBmc(value, fail);
}

function parseRedfishBmc(
  value: Record<string, unknown>,
  fail: (field: string, problem: string) => InventoryError,
): InventoryRedfishBmc {
  for (const key of Object.keys(value)) {
    if (!(BMC_KEYS as readonly string[]).includes(key)) {
      const hint = (IPMI_BMC_KEYS as readonly string[]).includes(key) ? '; an IPMI BMC needs "protocol": "ipmi"' : '';
      throw fail(key, `unknown key (want ${BMC_KEYS.join(', ')})${hint}`);
    }
  }
  const { url, insecure } = value;
  if (url === undefined) throw fail('url', 'missing: the Redfish ComputerSystem URL');
  if (typeof url !== 'string') throw fail('url', `want a string, got ${kindOf(url)}`);
  let parsed: URL | undefined;
  try {
    parsed = new URL(url);
  } catch {
    parsed = undefined;
  }
  if (!parsed || (parsed.protocol !== 'https:' && parsed.protocol !== 'http:')) {
    throw fail('url', `want an http(s):// URL of the Redfish ComputerSystem, got ${show(redactUrl(url, 'userinfo'))}`);
  }
  if (parsed.username !== '' || parsed.password !== '') {
    throw fail('url', 'credentials in the URL are not used: give username and password or passwordFile instead');
  }
  if (insecure !== undefined && typeof insecure !== 'boolean') {
    throw fail('insecure', `want true or false, got ${show(insecure)}`);
  }
  return { protocol: 'redfish', url, ...parseCredentials(value, fail), insecure: insecure ?? false };
}

function parseIpmiBmc(
  value: Record<string, unknown>,
  fail: (field: string, problem: string) => InventoryError,
): InventoryIpmiBmc {
  for (const key of Object.keys(value)) {
    if (!(IPMI_BMC_KEYS as readonly string[]).includes(key)) {
      const hint = key === 'url' ? "; url is a Redfish BMC's, an IPMI BMC takes host and port" : '';
      throw fail(key, `unknown key for an IPMI BMC (want ${IPMI_BMC_KEYS.join(', ')})${hint}`);
    }
  }
  const { host, port, cipherSuite } = value;
  if (host === undefined) throw fail('host', "missing: the IPMI BMC's address or host name");
  if (typeof host !== 'string' || !(isIP(host) !== 0 || HOST_NAME.test(host))) {
    throw fail('host', `want an IP literal or a host name, got ${show(host)}`);
  }
  if (port !== undefined && (!Number.isSafeInteger(port) || (port as number) < 1 || (port as number) > 65535)) {
    throw fail('port', `want a UDP port from 1 to 65535 (623 when left out), got ${show(port)}`);
  }
  if (
    cipherSuite !== undefined &&
    (!Number.isSafeInteger(cipherSuite) || (cipherSuite as number) < 0 || (cipherSuite as number) > 17)
  ) {
    throw fail('cipherSuite', `want an RMCP+ cipher suite from 0 to 17 (17 when left out), got ${show(cipherSuite)}`);
  }
  return {
    protocol: 'ipmi',
    host,
    port: (port as number | undefined) ?? IPMI_DEFAULT_PORT,
    ...parseCredentials(value, fail),
    cipherSuite: (cipherSuite as number | undefined) ?? IPMI_DEFAULT_CIPHER_SUITE,
  };
}

/** `username` and `password` or `passwordFile`, as both protocols take them. */
function parseCredentials(
  value: Record<string, unknown>,
  fail: (field: string, problem: string) => InventoryError,
): { username: string | undefined; password: BmcPassword | undefined } {
  const { username, password, passwordFile } = value;
  if (username !== undefined && (typeof username !== 'string' || username === '')) {
    throw fail('username', `want a non-empty string, got ${kindOf(username)}`);
  }
  // The password's value is never shown, not even when it is of the wrong kind.
  if (password !== undefined && passwordFile !== undefined) {
    throw fail('password', 'both password and passwordFile given; use one');
  }
  if (password !== undefined && (typeof password !== 'string' || password === '')) {
    throw fail('password', 'want a non-empty string');
  }
  if (passwordFile !== undefined && (typeof passwordFile !== 'string' || !path.isAbsolute(passwordFile))) {
    throw fail('passwordFile', `want an absolute path, got ${show(passwordFile)}`);
  }
  return {
    username,
    password:
      typeof password === 'string'
        ? { kind: 'inline', password: new Secret(password) }
        : typeof passwordFile === 'string'
          ? { kind: 'file', path: passwordFile }
          : undefined,
  };
}

/** A DNS host name (RFC 1123 labels). */
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?$/i;

/**
 * Where the inventory comes from: a file, or an `http(s)://` URL. Read anew
 * at every {@link InventorySource.read}, so the operator edits it while the
 * shepherd runs.
 */
export class InventorySource {
  /** The path or URL, as named in messages (a URL's user info masked). */
  readonly name: string;
  readonly #location: { kind: 'file'; path: string } | { kind: 'url'; url: URL; authorization: string | undefined };
  readonly #timeout: number;

  /**
   * @param location - a path, or an `http://` or `https://` URL
   * @param options.timeout - how long fetching a URL may take, in ms (default 10 s)
   */
  constructor(location: string, options: { timeout?: number } = {}) {
    this.#timeout = options.timeout ?? 10_000;
    if (/^https?:\/\//i.test(location)) {
      // User info in the URL is sent as basic authentication (fetch refuses such URLs) and never shown.
      let url: URL;
      try {
        url = new URL(location);
      } catch {
        throw new InventoryError(redactUrl(location, 'userinfo'), {}, 'not a valid URL');
      }
      const authorization =
        url.username === '' && url.password === ''
          ? undefined
          : `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`).toString('base64')}`;
      url.username = '';
      url.password = '';
      this.#location = { kind: 'url', url, authorization };
      this.name = redactUrl(location, 'userinfo');
    } else if (/^[a-z][a-z0-9+.-]*:\/\//i.test(location)) {
      throw new InventoryError(redactUrl(location, 'userinfo'), {}, 'want a file path or an http:// or https:// URL');
    } else {
      this.#location = { kind: 'file', path: path.resolve(location) };
      this.name = location;
    }
  }

  /**
   * Reads and checks the inventory.
   *
   * @throws {@link InventoryError} when it cannot be read or is bad; an
   *   inventory file holding passwords must not be readable by group or
   *   others, and one from a plain `http://` URL must hold none
   */
  async read(signal?: AbortSignal): Promise<InventoryMachine[]> {
    const location = this.#location;
    if (location.kind === 'file') {
      let text: string;
      let mode: number;
      try {
        [text, mode] = await Promise.all([
          readFile(location.path, { encoding: 'utf8', signal }),
          stat(location.path).then((s) => s.mode),
        ]);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        throw new InventoryError(this.name, {}, `cannot read (${errorCode(error)})`, { cause: error });
      }
      const machines = parseInventory(text, this.name);
      const holder = machines.findIndex((m) => m.bmc?.password?.kind === 'inline');
      if (holder >= 0 && (mode & 0o077) !== 0) {
        throw new InventoryError(
          this.name,
          { index: holder, id: machines[holder]?.id, field: 'bmc.password' },
          `the file holds BMC passwords but is readable by group or others (mode ${(mode & 0o777).toString(8).padStart(4, '0')}); ` +
            'chmod 600 it, or use passwordFile',
        );
      }
      return machines;
    }
    const text = await this.#fetch(location.url, location.authorization, signal);
    const machines = parseInventory(text, this.name);
    const holder = machines.findIndex((m) => m.bmc?.password?.kind === 'inline');
    if (holder >= 0 && location.url.protocol === 'http:') {
      throw new InventoryError(
        this.name,
        { index: holder, id: machines[holder]?.id, field: 'bmc.password' },
        'an inventory served over plain http:// must not hold passwords; serve it over https:// or use passwordFile',
      );
    }
    return machines;
  }

  async #fetch(url: URL, authorization: string | undefined, signal: AbortSignal | undefined): Promise<string> {
    const timeout = AbortSignal.timeout(this.#timeout);
    let response: Response;
    try {
      response = await fetch(url, {
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
        headers: { accept: 'application/json', ...(authorization === undefined ? {} : { authorization }) },
        redirect: 'follow',
      });
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      const problem = timeout.aborted ? `no answer within ${this.#timeout} ms` : describeError(error);
      throw new InventoryError(this.name, {}, `cannot fetch (${problem})`, { cause: error });
    }
    if (response.status !== 200) {
      await response.body?.cancel();
      throw new InventoryError(this.name, {}, `cannot fetch (HTTP ${response.status})`);
    }
    const length = Number(response.headers.get('content-length') ?? 0);
    if (length > MAX_INVENTORY_BYTES) {
      await response.body?.cancel();
      throw new InventoryError(this.name, {}, `larger than ${MAX_INVENTORY_BYTES} bytes`);
    }
    try {
      const text = await response.text();
      if (text.length > MAX_INVENTORY_BYTES) throw new Error(`larger than ${MAX_INVENTORY_BYTES} bytes`);
      return text;
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      throw new InventoryError(this.name, {}, `cannot fetch (${describeError(error)})`, { cause: error });
    }
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `${typeof value} ${show(value)}`;
}

/** A value for a message, cut short. */
function show(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

function errorCode(error: unknown): string {
  return (error as NodeJS.ErrnoException).code ?? describeError(error);
}
