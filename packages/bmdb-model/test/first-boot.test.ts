/**
 * The installed OS's first boot in the BMDB: what a request gives it
 * (hostname, SSH keys, network), handed out with the request; the secret's
 * hash the agent's Success report stores; and the OS's report that it
 * booted, against that hash, with the bound after which it reads
 * installed-not-booted (time moved in the database).
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import {
  AgentHeartbeats,
  addProvided,
  bootSecretSha256,
  FirstBootSettingError,
  newMachine,
  type OSInstallationRequest,
  osInstallation,
  recordFirstBoot,
  requestOSInstallation,
  setAgentHeartbeat,
  setAgentStarted,
} from '../src/index.js';

const { bmdb } = await testBMDB();
const q = bmdb.db;

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';
const HOST_KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0st0Kq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5QeA root@node';
const NETWORK = {
  interfaces: [
    {
      kind: 'device' as const,
      name: 'eno1',
      mac: '0c:c4:7a:00:00:01',
      addresses: ['192.0.2.10/24'],
      dhcp: false,
      routes: [{ destination: '0.0.0.0/0', gateway: '192.0.2.1' }],
    },
  ],
  nameservers: ['192.0.2.53'],
};
const IMAGE: OSInstallationRequest = {
  imageUrl: 'https://images.example.com/debian.img',
  imageSha256: 'ab'.repeat(32),
  rootDevice: '/dev/sda',
  actor: 'alice@ops',
  reason: 'first boot',
};

async function machineWithAgent(providerId: string): Promise<{ machineId: string; key: Uint8Array }> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Boot', providerId });
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, { publicKey: key, startedAt: new Date() });
  await setAgentHeartbeat(q, machineId);
  return { machineId, key };
}

/** Installs the machine's request as its agent would: the request handed out, then its Success with the secret's hash. */
async function installed(machineId: string, key: Uint8Array, secret: string): Promise<void> {
  const handed = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
  const generation = handed.result === 'recorded' ? handed.installationRequest?.generation : undefined;
  if (generation === undefined) throw new Error('no request handed out');
  const answer = await AgentHeartbeats.of(bmdb).answer({
    machineId,
    publicKey: key,
    installationReport: {
      generation,
      result: 'Success',
      raw: new Uint8Array([8, Number(generation)]),
      bootSecretSha256: bootSecretSha256(secret),
    },
  });
  expect(answer).toMatchObject({ result: 'recorded', report: 'stored' });
}

const secret = () => randomBytes(32).toString('base64url');

describe('what a request gives the installed OS', () => {
  test('hostname (the provider ID unless given), SSH keys and network are stored and handed out with the request', async () => {
    const { machineId, key } = await machineWithAgent('rack3-node1');
    const plain = await requestOSInstallation(q, machineId, IMAGE);
    expect(plain).toMatchObject({ hostname: 'rack3-node1', sshPublicKeys: [], network: undefined });
    await requestOSInstallation(q, machineId, {
      ...IMAGE,
      hostname: 'db1.example.com',
      sshPublicKeys: [` ${KEY}\n`],
      network: NETWORK,
    });
    const answer = await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    expect(answer).toMatchObject({
      result: 'recorded',
      installationRequest: { hostname: 'db1.example.com', sshPublicKeys: [KEY], network: NETWORK },
    });
  });

  test('a provider ID that is no hostname gives the machine ID as hostname', async () => {
    const { machineId } = await machineWithAgent('rack 3/node_2');
    expect((await requestOSInstallation(q, machineId, IMAGE)).hostname).toBe(machineId);
  });

  test.each<[string, Partial<OSInstallationRequest>, string]>([
    ['a hostname with an underscore', { hostname: 'node_1' }, 'hostname: "node_1" is not a hostname'],
    [
      'a key that is not OpenSSH’s',
      { sshPublicKeys: ['ssh-ed25519 notbase64!'] },
      'ssh-key: "ssh-ed25519 notbase64!" is not an OpenSSH public key',
    ],
    [
      'a key whose blob names another type',
      { sshPublicKeys: [KEY.replace('ssh-ed25519', 'ssh-rsa')] },
      'is not an OpenSSH public key',
    ],
    [
      'an address without its prefix',
      { network: { ...NETWORK, interfaces: [{ ...NETWORK.interfaces[0], addresses: ['192.0.2.10'] }] } as never },
      'network: interface eno1: address "192.0.2.10" is not an IP address/prefix length',
    ],
    [
      'a VLAN over an interface not listed',
      {
        network: { interfaces: [{ kind: 'vlan', name: 'vlan20', parent: 'bond0', id: 20 }], nameservers: [] } as never,
      },
      'network: interface vlan20: "bond0" is not among the interfaces',
    ],
    [
      'an upper-case MAC',
      {
        network: { interfaces: [{ kind: 'device', name: 'eno1', mac: '0C:C4:7A:00:00:01' }], nameservers: [] } as never,
      },
      'mac "0C:C4:7A:00:00:01"',
    ],
  ])('refuses %s, naming it, and writes nothing', async (_, change, message) => {
    const { machineId } = await machineWithAgent(`bad-${randomBytes(3).toString('hex')}`);
    const refusal = requestOSInstallation(q, machineId, { ...IMAGE, ...change });
    await expect(refusal).rejects.toThrow(FirstBootSettingError);
    await expect(refusal).rejects.toThrow(message);
    expect(await osInstallation(q, machineId)).toBeUndefined();
  });
});

describe('the first boot', () => {
  test('the right secret marks the installation booted with the time and host keys; again, nothing changes', async () => {
    const { machineId, key } = await machineWithAgent('rack3-node3');
    await requestOSInstallation(q, machineId, IMAGE);
    const right = secret();
    await installed(machineId, key, right);
    expect(await osInstallation(q, machineId)).toMatchObject({
      state: 'Succeeded',
      firstBoot: 'booting',
      bootedAt: null,
    });

    expect(await recordFirstBoot(q, machineId, { secret: secret(), hostKeys: [HOST_KEY] })).toEqual({
      result: 'refused',
    });
    expect(await osInstallation(q, machineId)).toMatchObject({
      firstBoot: 'booting',
      bootedAt: null,
      bootedHostKeys: [],
    });

    const booted = await recordFirstBoot(q, machineId, { secret: right, hostKeys: [HOST_KEY] });
    expect(booted).toMatchObject({ result: 'booted', hostKeys: [HOST_KEY] });
    const after = await osInstallation(q, machineId);
    expect(after).toMatchObject({ firstBoot: 'booted', bootedHostKeys: [HOST_KEY] });
    expect(after?.bootedAt).toBeInstanceOf(Date);

    const again = await recordFirstBoot(q, machineId, { secret: right, hostKeys: [] });
    expect(again).toEqual({ result: 'repeated', bootedAt: after?.bootedAt, hostKeys: [HOST_KEY] });
    expect(await osInstallation(q, machineId)).toEqual(after);
  });

  test('an OS silent past the bound reads installed-not-booted; a new request takes its secret away', async () => {
    const { machineId, key } = await machineWithAgent('rack3-node4');
    await requestOSInstallation(q, machineId, IMAGE);
    const right = secret();
    await installed(machineId, key, right);
    await sql`UPDATE machine_os_installation_request SET installation_ended_at = now() - interval '29 minutes'
      WHERE machine_id = ${machineId}`.execute(q);
    expect((await osInstallation(q, machineId))?.firstBoot).toBe('booting');
    await sql`UPDATE machine_os_installation_request SET installation_ended_at = now() - interval '31 minutes'
      WHERE machine_id = ${machineId}`.execute(q);
    expect((await osInstallation(q, machineId))?.firstBoot).toBe('installed-not-booted');

    await requestOSInstallation(q, machineId, { ...IMAGE, reason: 'again' });
    expect(await recordFirstBoot(q, machineId, { secret: right, hostKeys: [] })).toEqual({ result: 'refused' });
    expect(await osInstallation(q, machineId)).toMatchObject({
      state: 'Requested',
      firstBoot: undefined,
      bootedAt: null,
    });
  });

  test('a secret of the wrong form, a machine ID that is no UUID and a bad host key are refused, naming them', async () => {
    const { machineId } = await machineWithAgent('rack3-node5');
    await expect(recordFirstBoot(q, machineId, { secret: 'short', hostKeys: [] })).rejects.toThrow(
      `first boot report of machine ${machineId}: the secret is not 43 base64url characters`,
    );
    await expect(recordFirstBoot(q, 'node5', { secret: secret(), hostKeys: [] })).rejects.toThrow(
      'machine ID "node5" is not a UUID',
    );
    await expect(recordFirstBoot(q, machineId, { secret: secret(), hostKeys: ['ssh-ed25519 x'] })).rejects.toThrow(
      'host key: ssh-key: "ssh-ed25519 x" is not an OpenSSH public key',
    );
  });
});
