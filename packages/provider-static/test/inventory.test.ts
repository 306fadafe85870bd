import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { inspect } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { InventoryError, InventorySource } from '../src/index.js';
import { parseInventory } from '../src/inventory.js';

const SOURCE = '/etc/shepherd/inventory.json';

function parseError(value: unknown): InventoryError {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  try {
    parseInventory(text, SOURCE);
  } catch (error) {
    expect(error).toBeInstanceOf(InventoryError);
    return error as InventoryError;
  }
  throw new Error(`parseInventory accepted ${text}`);
}

const bmc = { url: 'https://10.1.7.7/redfish/v1/Systems/1', username: 'admin', passwordFile: '/etc/shepherd/bmc/n7' };

describe('parseInventory', () => {
  test('reads what shepherd install gives the installed OS: hostname, SSH keys, network', () => {
    const key = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';
    const network = { interfaces: [{ kind: 'device', name: 'eno1', mac: '0c:c4:7a:00:00:01', dhcp: true }] };
    const [machine] = parseInventory(
      JSON.stringify([{ id: 'n1', address: '10.0.0.1', hostname: 'db1', sshPublicKeys: [key], network }]),
      SOURCE,
    );
    expect(machine).toMatchObject({
      hostname: 'db1',
      sshPublicKeys: [key],
      network: {
        interfaces: [{ kind: 'device', name: 'eno1', mac: '0c:c4:7a:00:00:01', addresses: [], dhcp: true, routes: [] }],
        nameservers: [],
      },
    });
  });

  test('reads the shepherd’s own format, with and without BMCs', () => {
    const machines = parseInventory(
      JSON.stringify([
        { id: 'rack1-node07', address: '10.0.7.7', location: 'ams1', bmc },
        {
          id: 'rack1-node08',
          address: '2001:db8::8',
          bmc: { url: 'http://10.1.7.8/redfish/v1/Systems/1', password: 'pw', insecure: true },
        },
        { id: 'rack1-node09', address: '10.0.7.9' },
      ]),
      SOURCE,
    );
    expect(machines).toEqual([
      {
        id: 'rack1-node07',
        address: '10.0.7.7',
        location: 'ams1',
        bmc: {
          protocol: 'redfish',
          url: bmc.url,
          username: 'admin',
          password: { kind: 'file', path: bmc.passwordFile },
          insecure: false,
        },
        agentBoot: 'ssh',
        macs: [],
      },
      {
        id: 'rack1-node08',
        address: '2001:db8::8',
        location: undefined,
        bmc: expect.objectContaining({
          url: 'http://10.1.7.8/redfish/v1/Systems/1',
          username: undefined,
          insecure: true,
        }),
        agentBoot: 'ssh',
        macs: [],
      },
      { id: 'rack1-node09', address: '10.0.7.9', location: undefined, bmc: undefined, agentBoot: 'ssh', macs: [] },
    ]);
    const password = machines[1]?.bmc?.password;
    expect(password?.kind).toBe('inline');
    if (password?.kind === 'inline') expect(password.password.reveal()).toBe('pw');
    // The password never shows when the inventory is logged.
    expect(JSON.stringify(machines)).not.toContain('"pw"');
    expect(inspect(machines, { depth: 10 })).not.toContain("'pw'");
  });

  test('reads IPMI BMCs: host, port, credentials and cipher suite, with defaults', () => {
    const machines = parseInventory(
      JSON.stringify([
        {
          id: 'node07',
          address: '10.0.7.7',
          bmc: {
            protocol: 'ipmi',
            host: '10.1.7.7',
            port: 6230,
            username: 'admin',
            passwordFile: '/etc/shepherd/bmc/node07',
            cipherSuite: 3,
          },
        },
        { id: 'node08', address: '10.0.7.8', bmc: { protocol: 'ipmi', host: 'bmc08.example.net' } },
        {
          id: 'node09',
          address: '10.0.7.9',
          bmc: { protocol: 'redfish', url: 'https://10.1.7.9/redfish/v1/Systems/1' },
        },
      ]),
      SOURCE,
    );
    expect(machines.map((m) => m.bmc)).toEqual([
      {
        protocol: 'ipmi',
        host: '10.1.7.7',
        port: 6230,
        username: 'admin',
        password: { kind: 'file', path: '/etc/shepherd/bmc/node07' },
        cipherSuite: 3,
      },
      {
        protocol: 'ipmi',
        host: 'bmc08.example.net',
        port: 623,
        username: undefined,
        password: undefined,
        cipherSuite: 17,
      },
      {
        protocol: 'redfish',
        url: 'https://10.1.7.9/redfish/v1/Systems/1',
        username: undefined,
        password: undefined,
        insecure: false,
      },
    ]);
  });

  test('accepts the upstream mini device list as is', () => {
    expect(
      parseInventory(
        JSON.stringify([
          { ID: 'm1', Addr: '192.0.2.1', Location: 'lab' },
          { ID: 'm2', Addr: '192.0.2.2', Location: '' },
        ]),
        SOURCE,
      ),
    ).toEqual([
      { id: 'm1', address: '192.0.2.1', location: 'lab', bmc: undefined, agentBoot: 'ssh', macs: [] },
      { id: 'm2', address: '192.0.2.2', location: undefined, bmc: undefined, agentBoot: 'ssh', macs: [] },
    ]);
  });

  test('reads how each agent arrives: MACs lower-cased, no address needed when the BMC boots it', () => {
    const ipmi = { protocol: 'ipmi', host: '10.1.7.9' };
    const machines = parseInventory(
      JSON.stringify([
        { id: 'cd1', agentBoot: 'virtual-media', bmc, bootMode: 'legacy' },
        { id: 'cd2', agentBoot: 'virtual-media', bmc, macs: ['AA:BB:CC:00:11:22'], address: '10.0.7.2' },
        { id: 'pxe1', agentBoot: 'network', bmc: ipmi, macs: ['aa-bb-cc-00-11-33', '52:54:00:00:00:01'] },
        { id: 'ssh1', agentBoot: 'ssh', address: '10.0.7.4', macs: ['52:54:00:00:00:02'], bootMode: 'uefi' },
      ]),
      SOURCE,
    );
    expect(
      machines.map(({ id, address, agentBoot, macs, bootMode }) => ({ id, address, agentBoot, macs, bootMode })),
    ).toEqual([
      { id: 'cd1', address: undefined, agentBoot: 'virtual-media', macs: [], bootMode: 'legacy' },
      { id: 'cd2', address: '10.0.7.2', agentBoot: 'virtual-media', macs: ['aa:bb:cc:00:11:22'], bootMode: undefined },
      {
        id: 'pxe1',
        address: undefined,
        agentBoot: 'network',
        macs: ['aa:bb:cc:00:11:33', '52:54:00:00:00:01'],
        bootMode: undefined,
      },
      { id: 'ssh1', address: '10.0.7.4', agentBoot: 'ssh', macs: ['52:54:00:00:00:02'], bootMode: 'uefi' },
    ]);
  });

  test('an empty inventory is an empty fleet', () => {
    expect(parseInventory('[]', SOURCE)).toEqual([]);
  });

  test.each<[string, unknown, string]>([
    ['not JSON', '[{"id": "a",', `inventory ${SOURCE}: not JSON (`],
    ['not an array', { machines: [] }, `inventory ${SOURCE}: want a JSON array of machines, got an object`],
    ['an entry that is no object', [42], `inventory ${SOURCE}: entry 0: want an object, got number 42`],
    ['a missing id', [{ address: '10.0.0.1' }], 'entry 0, field id: missing'],
    ['an id of the wrong type', [{ id: 7, address: '10.0.0.1' }], 'entry 0, field id: want a string, got number 7'],
    ['an empty id', [{ id: '', address: '10.0.0.1' }], 'entry 0 (id ""), field id: want a non-empty id'],
    [
      'an id with spaces',
      [{ id: 'node 1', address: '10.0.0.1' }],
      'entry 0 (id "node 1"), field id: want a non-empty id',
    ],
    [
      'a duplicate id',
      [
        { id: 'n1', address: '10.0.0.1' },
        { id: 'n1', address: '10.0.0.2' },
      ],
      'entry 1 (id "n1"), field id: duplicate id: entry 0 has it too',
    ],
    ['a missing address', [{ id: 'n1' }], 'entry 0 (id "n1"), field address: missing (the agent arrives over SSH'],
    [
      'a missing address of an ssh machine',
      [{ id: 'n1', agentBoot: 'ssh', bmc, macs: ['aa:bb:cc:dd:ee:ff'] }],
      'entry 0 (id "n1"), field address: missing',
    ],
    [
      'an unknown agentBoot',
      [{ id: 'n1', address: '10.0.0.1', agentBoot: 'pxe' }],
      'entry 0 (id "n1"), field agentBoot: want one of ssh, virtual-media, network (ssh when left out), got "pxe"',
    ],
    [
      'virtual media without a bmc',
      [{ id: 'n1', agentBoot: 'virtual-media' }],
      'entry 0 (id "n1"), field agentBoot: virtual-media needs a Redfish BMC (bmc with a url), got no bmc',
    ],
    [
      'virtual media with an IPMI bmc',
      [{ id: 'n1', agentBoot: 'virtual-media', bmc: { protocol: 'ipmi', host: '10.1.0.1' } }],
      'entry 0 (id "n1"), field agentBoot: virtual-media needs a Redfish BMC (bmc with a url), got an IPMI bmc; use network',
    ],
    [
      'a network boot without a bmc',
      [{ id: 'n1', agentBoot: 'network', macs: ['aa:bb:cc:dd:ee:ff'] }],
      'entry 0 (id "n1"), field agentBoot: network needs a bmc (Redfish or IPMI)',
    ],
    [
      'a network boot without MACs',
      [{ id: 'n1', agentBoot: 'network', bmc }],
      'entry 0 (id "n1"), field macs: missing: a network boot needs the MAC of at least one of its NICs',
    ],
    [
      'a network boot with no MAC in macs',
      [{ id: 'n1', agentBoot: 'network', bmc, macs: [] }],
      'entry 0 (id "n1"), field macs: missing',
    ],
    [
      'macs that is no array',
      [{ id: 'n1', address: '10.0.0.1', macs: 'aa:bb:cc:dd:ee:ff' }],
      'entry 0 (id "n1"), field macs: want an array of MAC addresses, got string "aa:bb:cc:dd:ee:ff"',
    ],
    [
      'a bad MAC',
      [{ id: 'n1', address: '10.0.0.1', macs: ['aa:bb:cc:dd:ee:ff', 'aa:bb:cc:dd:ee'] }],
      'entry 0 (id "n1"), field macs[1]: want a MAC address like "aa:bb:cc:dd:ee:ff", got "aa:bb:cc:dd:ee"',
    ],
    [
      'a MAC with mixed separators',
      [{ id: 'n1', address: '10.0.0.1', macs: ['aa:bb-cc:dd:ee:ff'] }],
      'field macs[0]: want a MAC address like "aa:bb:cc:dd:ee:ff", got "aa:bb-cc:dd:ee:ff"',
    ],
    [
      'a MAC that is no string',
      [{ id: 'n1', address: '10.0.0.1', macs: [42] }],
      'field macs[0]: want a MAC address like "aa:bb:cc:dd:ee:ff", got 42',
    ],
    [
      'a MAC twice in one entry',
      [{ id: 'n1', address: '10.0.0.1', macs: ['aa:bb:cc:dd:ee:ff', 'AA:BB:CC:DD:EE:FF'] }],
      'entry 0 (id "n1"), field macs[1]: duplicate MAC aa:bb:cc:dd:ee:ff',
    ],
    [
      'a MAC of two machines',
      [
        { id: 'n1', address: '10.0.0.1', macs: ['aa:bb:cc:dd:ee:ff'] },
        { id: 'n2', agentBoot: 'network', bmc, macs: ['52:54:00:00:00:01', 'AA-BB-CC-DD-EE-FF'] },
      ],
      'entry 1 (id "n2"), field macs[1]: duplicate MAC aa:bb:cc:dd:ee:ff: entry 0 has it too',
    ],
    [
      'an unknown bootMode',
      [{ id: 'n1', address: '10.0.0.1', bootMode: 'UEFI' }],
      'entry 0 (id "n1"), field bootMode: want one of uefi, legacy, got "UEFI"',
    ],
    [
      'a host name for an address',
      [{ id: 'n1', address: 'node1.example.com' }],
      'entry 0 (id "n1"), field address: want an IPv4 or IPv6 literal, got "node1.example.com"',
    ],
    [
      'an address with a port',
      [{ id: 'n1', address: '10.0.0.1:22' }],
      'field address: want an IPv4 or IPv6 literal, got "10.0.0.1:22"',
    ],
    [
      'a mini address that is no IP',
      [{ ID: 'n1', Addr: '10.0.0.300' }],
      'entry 0 (id "n1"), field Addr: want an IPv4 or IPv6 literal, got "10.0.0.300"',
    ],
    [
      'a duplicate address',
      [
        { id: 'n1', address: '10.0.0.1' },
        { id: 'n2', address: '10.0.0.1' },
      ],
      'entry 1 (id "n2"), field address: duplicate address 10.0.0.1: entry 0 has it too',
    ],
    ['a location of the wrong type', [{ id: 'n1', address: '10.0.0.1', location: 3 }], 'field location: want a string'],
    [
      'an unknown key',
      [{ id: 'n1', address: '10.0.0.1', adress: '10.0.0.2' }],
      'entry 0 (id "n1"), field adress: unknown key (want id, address, location, bmc, agentBoot, macs, bootMode',
    ],
    [
      'both spellings of a key',
      [{ id: 'n1', ID: 'n1', address: '10.0.0.1' }],
      'field id: both id and ID given; use one',
    ],
    ['a bmc that is no object', [{ id: 'n1', address: '10.0.0.1', bmc: 'https://x' }], 'field bmc.: want an object'],
    ['a bmc without url', [{ id: 'n1', address: '10.0.0.1', bmc: { username: 'a' } }], 'field bmc.url: missing'],
    [
      'a bmc url that is not http(s)',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'ftp://10.1.0.1/redfish/v1/Systems/1' } }],
      'entry 0 (id "n1"), field bmc.url: want an http(s):// URL of the Redfish ComputerSystem, got "ftp://',
    ],
    [
      'a bmc url that is no URL',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: '10.1.0.1/redfish' } }],
      'field bmc.url: want an http(s):// URL',
    ],
    [
      'credentials in the bmc url',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://root:hunter2@10.1.0.1/redfish/v1/Systems/1' } }],
      'field bmc.url: credentials in the URL are not used',
    ],
    [
      'an unknown bmc key',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', user: 'root' } }],
      'field bmc.user: unknown key (want protocol, url, username, password, passwordFile, insecure)',
    ],
    [
      'an IPMI key on a Redfish bmc',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', host: '10.1.0.1' } }],
      'entry 0 (id "n1"), field bmc.host: unknown key (want protocol, url, username, password, passwordFile, insecure); an IPMI BMC needs "protocol": "ipmi"',
    ],
    [
      'an unknown bmc protocol',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ilo', url: 'https://10.1.0.1/' } }],
      'entry 0 (id "n1"), field bmc.protocol: want one of redfish, ipmi (redfish when left out), got "ilo"',
    ],
    [
      'an IPMI bmc without host',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', port: 623 } }],
      'entry 0 (id "n1"), field bmc.host: missing: the IPMI BMC\'s address or host name',
    ],
    [
      'an IPMI bmc with a url',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', url: 'https://10.1.0.1/' } }],
      "field bmc.url: unknown key for an IPMI BMC (want protocol, host, port, username, password, passwordFile, cipherSuite); url is a Redfish BMC's, an IPMI BMC takes host and port",
    ],
    [
      'an IPMI host that is no host',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: 'bmc 7' } }],
      'field bmc.host: want an IP literal or a host name, got "bmc 7"',
    ],
    [
      'an IPMI port out of range',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', port: 70000 } }],
      'field bmc.port: want a UDP port from 1 to 65535 (623 when left out), got 70000',
    ],
    [
      'an IPMI port that is a string',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', port: '623' } }],
      'field bmc.port: want a UDP port from 1 to 65535 (623 when left out), got "623"',
    ],
    [
      'an IPMI cipher suite out of range',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', cipherSuite: 18 } }],
      'field bmc.cipherSuite: want an RMCP+ cipher suite from 0 to 17 (17 when left out), got 18',
    ],
    [
      'an IPMI password of the wrong type',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', password: 7 } }],
      'field bmc.password: want a non-empty string',
    ],
    [
      'an IPMI relative passwordFile',
      [{ id: 'n1', address: '10.0.0.1', bmc: { protocol: 'ipmi', host: '10.1.0.1', passwordFile: 'pw' } }],
      'field bmc.passwordFile: want an absolute path, got "pw"',
    ],
    [
      'an empty username',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', username: '' } }],
      'field bmc.username: want a non-empty string',
    ],
    [
      'both password and passwordFile',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 'x', passwordFile: '/p' } }],
      'field bmc.password: both password and passwordFile given',
    ],
    [
      'a password of the wrong type',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 12345678 } }],
      'field bmc.password: want a non-empty string',
    ],
    [
      'a relative passwordFile',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', passwordFile: 'bmc/n1' } }],
      'field bmc.passwordFile: want an absolute path, got "bmc/n1"',
    ],
    [
      'insecure that is no boolean',
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', insecure: 'yes' } }],
      'field bmc.insecure: want true or false, got "yes"',
    ],
    [
      'a hostname that is none',
      [{ id: 'n1', address: '10.0.0.1', hostname: 'node_1' }],
      'field hostname: "node_1" is not a hostname',
    ],
    [
      'an SSH key that is none',
      [{ id: 'n1', address: '10.0.0.1', sshPublicKeys: ['ssh-ed25519 AAAA'] }],
      'field sshPublicKeys[0]: "ssh-ed25519 AAAA" is not an OpenSSH public key',
    ],
    [
      'a network with a bond over an interface not listed',
      [
        {
          id: 'n1',
          address: '10.0.0.1',
          network: { interfaces: [{ kind: 'bond', name: 'bond0', mode: '802.3ad', members: ['eno9'] }] },
        },
      ],
      'field network: interface bond0: "eno9" is not among the interfaces',
    ],
  ])('refuses %s, naming the file, the entry and the field', (_, value, expected) => {
    const error = parseError(value);
    expect(error.message).toContain(expected);
    expect(error.message.startsWith(`inventory ${SOURCE}: `)).toBe(true);
    expect(error.source).toBe(SOURCE);
  });

  test('never shows a password, not even a bad one or one in a bad URL', () => {
    for (const value of [
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 12345678 } }],
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 12345678, passwordFile: '/p' } }],
      [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'ftp://root:12345678@10.1.0.1/' } }],
    ]) {
      expect(parseError(value).message).not.toContain('12345678');
    }
  });
});

describe('InventorySource', () => {
  let dir: string;
  let server: Server;
  let served: { status: number; body: string };
  let base: string;
  let authorization: string | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'inventory-'));
    server = createServer((req, res) => {
      authorization = req.headers.authorization;
      res.writeHead(served.status).end(served.body);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await new Promise((resolve) => server.close(resolve));
    await rm(dir, { recursive: true, force: true });
  });

  async function file(name: string, content: unknown, mode = 0o644): Promise<string> {
    const file = path.join(dir, name);
    await writeFile(file, typeof content === 'string' ? content : JSON.stringify(content));
    await chmod(file, mode);
    return file;
  }

  test('reads a file anew on every read', async () => {
    const inventory = await file('fleet.json', [{ id: 'n1', address: '10.0.0.1' }]);
    const source = new InventorySource(inventory);
    expect((await source.read()).map((m) => m.id)).toEqual(['n1']);
    await file('fleet.json', [
      { id: 'n1', address: '10.0.0.1' },
      { id: 'n2', address: '10.0.0.2' },
    ]);
    expect((await source.read()).map((m) => m.id)).toEqual(['n1', 'n2']);
  });

  test('a missing file is named with the reason', async () => {
    const missing = path.join(dir, 'missing.json');
    await expect(new InventorySource(missing).read()).rejects.toThrow(`inventory ${missing}: cannot read (ENOENT)`);
  });

  test('a file holding a password must not be readable by group or others', async () => {
    const entries = [{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 'hunter2' } }];
    for (const mode of [0o644, 0o640, 0o604]) {
      const inventory = await file('secret.json', entries, mode);
      const error = await new InventorySource(inventory).read().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(InventoryError);
      expect(String(error)).toContain(
        `inventory ${inventory}: entry 0 (id "n1"), field bmc.password: the file holds BMC passwords but is readable by group or others (mode 0${mode.toString(8)}); chmod 600 it`,
      );
      expect(String(error)).not.toContain('hunter2');
    }
    const inventory = await file('secret.json', entries, 0o600);
    expect(await new InventorySource(inventory).read()).toHaveLength(1);
    // Secret files instead of passwords: any mode will do for the inventory.
    const open = await file('open.json', [
      { id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', passwordFile: '/p' } },
    ]);
    expect(await new InventorySource(open).read()).toHaveLength(1);
  });

  test('reads a URL anew on every read', async () => {
    const source = new InventorySource(`${base}/fleet.json`);
    served = { status: 200, body: JSON.stringify([{ ID: 'm1', Addr: '10.0.0.1' }]) };
    expect((await source.read()).map((m) => m.id)).toEqual(['m1']);
    served = { status: 200, body: JSON.stringify([{ ID: 'm2', Addr: '10.0.0.2' }]) };
    expect((await source.read()).map((m) => m.id)).toEqual(['m2']);
  });

  test('a URL that fails or serves a bad inventory is named', async () => {
    const source = new InventorySource(`${base}/fleet.json`);
    served = { status: 404, body: 'not here' };
    await expect(source.read()).rejects.toThrow(`inventory ${base}/fleet.json: cannot fetch (HTTP 404)`);
    served = { status: 200, body: '[{"id": "n1", "address": "nowhere"}]' };
    await expect(source.read()).rejects.toThrow(
      `inventory ${base}/fleet.json: entry 0 (id "n1"), field address: want an IPv4 or IPv6 literal`,
    );
    // Nobody listens on port 1.
    await expect(new InventorySource('http://127.0.0.1:1/fleet.json').read()).rejects.toThrow(
      'inventory http://127.0.0.1:1/fleet.json: cannot fetch (',
    );
  });

  test('an inventory over plain http:// must hold no passwords; a URL’s user info is never shown', async () => {
    served = {
      status: 200,
      body: JSON.stringify([{ id: 'n1', address: '10.0.0.1', bmc: { url: 'https://10.1.0.1/', password: 'hunter2' } }]),
    };
    const url = base.replace('http://', 'http://ops:topsecret@');
    const error = await new InventorySource(`${url}/fleet.json`).read().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(String(error)).toContain('must not hold passwords; serve it over https://');
    // The URL's user info went as basic authentication.
    expect(authorization).toBe(`Basic ${Buffer.from('ops:topsecret').toString('base64')}`);
    expect(String(error)).toContain('http://***@127.0.0.1');
    expect(String(error)).not.toContain('topsecret');
    expect(String(error)).not.toContain('hunter2');
  });

  test('a URL that does not parse is refused, its user info masked', () => {
    expect(() => new InventorySource('https://ops:topsecret@[::1/fleet.json')).toThrow(
      'inventory https://***@[::1/fleet.json: not a valid URL',
    );
  });

  test('other URL schemes are refused', () => {
    expect(() => new InventorySource('ftp://10.0.0.1/fleet.json')).toThrow(
      'inventory ftp://10.0.0.1/fleet.json: want a file path or an http:// or https:// URL',
    );
  });
});
