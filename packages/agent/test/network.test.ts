import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, test } from 'vitest';
import { networkSteps } from '../src/network/bring-up.js';
import type { NetworkConfig } from '../src/network/config.js';
import { networkFromIp } from '../src/network/from-ip.js';
import { networkFromProcfs } from '../src/network/from-procfs.js';

const fixtures = fileURLToPath(new URL('./fixtures/network/', import.meta.url));

async function ipOutput(shape: string) {
  const read = (file: string) => readFile(path.join(fixtures, shape, file), 'utf8');
  return {
    links: await read('ip-link.json'),
    addresses: await read('ip-addr.json'),
    routes4: await read('ip-route4.json'),
    routes6: await read('ip-route6.json'),
    resolvConf: await read('etc/resolv.conf'),
  };
}

/** The server's bond, its members and its VLAN, as both readers must see them. */
const BOND_AND_VLAN = [
  {
    name: 'bond0',
    mtu: 9000,
    kind: 'bond',
    mode: '802.3ad',
    members: ['enp65s0f0', 'enp65s0f1'],
    addresses: ['192.0.2.10/24', '2001:db8::10/64'],
    dhcp: false,
    routes: [
      { destination: '0.0.0.0/0', gateway: '192.0.2.1' },
      { destination: '::/0', gateway: '2001:db8::1', metric: 1024 },
    ],
  },
  {
    name: 'bond0.100',
    mtu: 1500,
    kind: 'vlan',
    parent: 'bond0',
    id: 100,
    protocol: '802.1Q',
    addresses: ['198.51.100.5/25'],
    dhcp: false,
    routes: [{ destination: '10.9.0.0/16', gateway: '198.51.100.1', metric: 50 }],
  },
];
const MEMBERS = [
  { name: 'enp65s0f0', mtu: 9000, kind: 'device', mac: 'b4:96:91:aa:00:01', addresses: [], dhcp: false, routes: [] },
  // A bond gives its members its own MAC: the permanent one is the NIC's.
  { name: 'enp65s0f1', mtu: 9000, kind: 'device', mac: 'b4:96:91:aa:00:02', addresses: [], dhcp: false, routes: [] },
];

describe('capturing the network', () => {
  test('ip -j of a server: NICs by permanent MAC, the bond with its mode and members, the VLAN, static addresses and configured routes; DHCP as DHCP', async () => {
    const { config, warnings } = networkFromIp(await ipOutput('bond-vlan-server'));
    expect(config.interfaces).toEqual([
      ...BOND_AND_VLAN,
      // Its lease, its DHCP route and its SLAAC address are not carried over as static: the image asks DHCP.
      { name: 'eno1', mtu: 1500, kind: 'device', mac: '3c:ec:ef:10:20:30', addresses: [], dhcp: true, routes: [] },
      ...MEMBERS,
      // eno2 has nothing configured and nothing on it: left to the image's DHCP.
    ]);
    expect(config.nameservers).toEqual(['192.0.2.53', '2001:db8::53']);
    expect(warnings).toEqual(['interface docker0 (bridge) is not carried over: only NICs, bonds and VLANs are']);
  });

  test('procfs and sysfs of the same server: the same bond, VLAN and members; a lease cannot be told from a static address, and a warning says so', async () => {
    const { config, warnings } = await networkFromProcfs(path.join(fixtures, 'bond-vlan-server'));
    expect(config.interfaces).toEqual([
      ...BOND_AND_VLAN,
      {
        name: 'eno1',
        mtu: 1500,
        kind: 'device',
        mac: '3c:ec:ef:10:20:30',
        addresses: ['203.0.113.7/24'],
        dhcp: false,
        routes: [{ destination: '0.0.0.0/0', gateway: '203.0.113.1', metric: 100 }],
      },
      ...MEMBERS,
    ]);
    expect(config.nameservers).toEqual(['192.0.2.53', '2001:db8::53']);
    expect(warnings).toEqual([
      'read from procfs, which does not tell a DHCP lease from a static address: IPv4 addresses handed over as static',
    ]);
  });

  test('a VM recorded with ip -j and with procfs: both read the one NIC, its IPv4 and IPv6 addresses and default routes alike', async () => {
    const fromIp = networkFromIp(await ipOutput('virtio-vm'));
    const fromProcfs = await networkFromProcfs(path.join(fixtures, 'virtio-vm'));
    const eth0 = {
      name: 'eth0',
      mtu: 1400,
      kind: 'device',
      mac: '02:fc:00:00:00:01',
      addresses: ['192.0.2.2/24', 'fd00::2/64'],
      dhcp: false,
      routes: [
        { destination: '0.0.0.0/0', gateway: '192.0.2.1' },
        { destination: '::/0', gateway: 'fd00::1', metric: 1024 },
      ],
    };
    expect(fromIp.config).toEqual({ interfaces: [eth0], nameservers: ['10.255.255.53'] });
    expect(fromIp.warnings).toEqual([]);
    expect(fromProcfs.config).toEqual(fromIp.config);
  });

  test("systemd-resolved's stub 127.0.0.53 is replaced by its upstream servers, read by ip -j's capture and procfs's alike", async () => {
    const stub =
      '# This is /run/systemd/resolve/stub-resolv.conf\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n';
    const upstream = '# This is /run/systemd/resolve/resolv.conf\nnameserver 192.0.2.53\nnameserver 2001:db8::53\n';
    const fromIp = networkFromIp({ ...(await ipOutput('virtio-vm')), resolvConf: stub, upstreamResolvConf: upstream });
    expect(fromIp.config.nameservers).toEqual(['192.0.2.53', '2001:db8::53']);
    const root = await mkdtemp(path.join(tmpdir(), 'agent-net-'));
    try {
      await cp(path.join(fixtures, 'virtio-vm'), root, { recursive: true });
      await writeFile(path.join(root, 'etc/resolv.conf'), stub);
      await mkdir(path.join(root, 'run/systemd/resolve'), { recursive: true });
      await writeFile(path.join(root, 'run/systemd/resolve/resolv.conf'), upstream);
      expect((await networkFromProcfs(root)).config.nameservers).toEqual(['192.0.2.53', '2001:db8::53']);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  test('a loopback resolver without upstream servers (a local cache, resolved stopped) is captured as it is', async () => {
    for (const local of ['127.0.0.1', '::1', '127.0.0.53']) {
      const { config } = networkFromIp({ ...(await ipOutput('virtio-vm')), resolvConf: `nameserver ${local}\n` });
      expect(config.nameservers).toEqual([local]);
    }
  });

  test('output that is not iproute2 JSON (busybox ip) is refused, so the capture falls back to procfs', () => {
    expect(() => networkFromIp({ links: '1: lo: <LOOPBACK,UP>', addresses: '', routes4: '', routes6: '' })).toThrow(
      SyntaxError,
    );
  });
});

describe('bringing the network up in the agent image', () => {
  test('NICs found by MAC under their new names; the bond (mode before members), the VLAN, MTUs, addresses, then routes and resolv.conf', async () => {
    const { config } = networkFromIp(await ipOutput('bond-vlan-server'));
    const plan = networkSteps(config, [
      { name: 'eth0', mac: '3c:ec:ef:10:20:30' },
      { name: 'eth1', mac: 'b4:96:91:aa:00:02' },
      { name: 'eth2', mac: 'b4:96:91:aa:00:01' },
    ]);
    const lines = plan.steps.map((s) => (s.kind === 'run' ? s.argv.join(' ') : `${s.file} <- ${s.text.trim()}`));
    expect(lines).toEqual([
      'ip link add name bond0 type bond',
      '/sys/class/net/bond0/bonding/mode <- 802.3ad',
      'ip link set eth2 down',
      'ip link set eth2 master bond0',
      'ip link set eth2 up',
      'ip link set eth1 down',
      'ip link set eth1 master bond0',
      'ip link set eth1 up',
      'ip link add link bond0 name bond0.100 type vlan id 100',
      'ip link set eth0 mtu 1500',
      'ip link set eth0 up',
      'ip link set eth2 mtu 9000',
      'ip link set eth2 up',
      'ip link set eth1 mtu 9000',
      'ip link set eth1 up',
      'ip link set bond0 mtu 9000',
      'ip link set bond0 up',
      'ip addr add 192.0.2.10/24 dev bond0',
      'ip addr add 2001:db8::10/64 dev bond0',
      'ip link set bond0.100 mtu 1500',
      'ip link set bond0.100 up',
      'ip addr add 198.51.100.5/25 dev bond0.100',
      'ip route add 0.0.0.0/0 via 192.0.2.1 dev bond0',
      'ip -6 route add ::/0 via 2001:db8::1 dev bond0 metric 1024',
      'ip route add 10.9.0.0/16 via 198.51.100.1 dev bond0.100 metric 50',
      '/etc/resolv.conf <- nameserver 192.0.2.53\nnameserver 2001:db8::53',
    ]);
    expect(plan.dhcp).toEqual(['eth0']);
    expect(plan.warnings).toEqual([]);
  });

  test("a loopback nameserver (the OS's own stub, not running here) is left out of resolv.conf, each named in a warning for the agent log", () => {
    const config: NetworkConfig = {
      interfaces: [],
      nameservers: ['127.0.0.53', '192.0.2.53', '::1', '127.0.0.1'],
    };
    const plan = networkSteps(config, []);
    expect(plan.steps).toEqual([{ kind: 'write', file: '/etc/resolv.conf', text: 'nameserver 192.0.2.53\n' }]);
    const why =
      "is a resolver on the loopback of the OS taken over (a stub such as systemd-resolved's, or a cache), which this image does not run, and no upstream server of it was captured: left out (DNS from DHCP, if any)";
    expect(plan.warnings).toEqual([
      `nameserver 127.0.0.53 ${why}`,
      `nameserver ::1 ${why}`,
      `nameserver 127.0.0.1 ${why}`,
    ]);
    // Only loopback ones: no resolv.conf is written at all.
    expect(networkSteps({ interfaces: [], nameservers: ['127.0.0.53'] }, []).steps).toEqual([]);
  });

  test('a NIC whose MAC is not on this machine is left out with what stands on it, each named in a warning', () => {
    const config: NetworkConfig = {
      interfaces: [
        {
          name: 'bond0',
          kind: 'bond',
          mode: 'active-backup',
          members: ['enp1s0'],
          addresses: ['192.0.2.10/24'],
          dhcp: false,
          routes: [],
        },
        {
          name: 'bond0.7',
          kind: 'vlan',
          parent: 'bond0',
          id: 7,
          protocol: '802.1ad',
          addresses: [],
          dhcp: false,
          routes: [],
        },
        { name: 'enp1s0', kind: 'device', mac: '52:54:00:00:00:01', addresses: [], dhcp: false, routes: [] },
      ],
      nameservers: [],
    };
    const plan = networkSteps(config, [{ name: 'eth0', mac: '52:54:00:00:00:99' }]);
    expect(plan.steps).toEqual([]);
    expect(plan.warnings).toEqual([
      'NIC enp1s0 (52:54:00:00:00:01) is not on this machine: its configuration is left out',
      'bond bond0: none of its members (enp1s0) is here: left out',
      'VLAN bond0.7: its parent bond0 is not here: left out',
    ]);
  });
});
