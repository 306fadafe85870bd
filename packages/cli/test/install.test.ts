/**
 * `shepherd install` and `install --cancel` through the built CLI, each
 * spawned as a process against a real BMDB: requests recorded with a new
 * generation, who and why; `status` showing them as text and JSON; cancels
 * and refusals; and every bad input exiting 2 naming its flag, touching
 * nothing.
 */
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  addProvided,
  newMachine,
  operatorHistory,
  osInstallation,
  recordFirstBoot,
  requestOSInstallation,
} from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { installedMachine } from '../../../test/support/machines.js';
import { buildOnce, expectUsageError, shepherd } from './helpers.js';

const { db, bmdb } = await testBMDB();
const q = bmdb.db;
let dir: string;
const SHA = 'c0ffee'.padEnd(64, '0');
const NODES = ['rack1-node1', 'rack1-node2', 'rack1-node3'];
const ids: Record<string, string> = {};

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-install-'));
  await writeFile(path.join(dir, 'user-data'), '#cloud-config\nhostname: node1\n');
  await writeFile(path.join(dir, 'empty'), '');
  await writeFile(path.join(dir, 'huge'), Buffer.alloc(64 * 1024 + 1, 0x41));
  await mkdir(path.join(dir, 'a-directory'));
  for (const id of NODES) {
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: 'Static', providerId: id });
    ids[id] = machineId;
  }
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const image = [
  '--image-url',
  'https://images.example.com/debian-12.img.gz',
  '--image-sha256',
  SHA.toUpperCase(),
  '--root-device',
  '/dev/sda',
  '--compression',
  'gzip',
];

describe('install', () => {
  test('requests an installation of each machine named, a new generation each, with who and why', async () => {
    const env = { SHEPHERD_BMDB_URL: db.url, DEBUG: '' };
    const first = await shepherd(
      [
        'install',
        '--provider',
        'Static',
        '--provider-id',
        'rack1-node1',
        'rack1-node2',
        ...image,
        '--user-data',
        path.join(dir, 'user-data'),
        '--reason',
        'first install',
        '--actor',
        'alice@ops',
      ],
      env,
    );
    expect(first.stderr).toBe('');
    expect(first.code).toBe(0);
    expect(first.stdout).toBe(
      NODES.slice(0, 2)
        .map(
          (id) =>
            `requested installation of Static ${id} (machine ${ids[id]}): generation 1, https://images.example.com/debian-12.img.gz onto /dev/sda\n`,
        )
        .join(''),
    );
    const installation = await osInstallation(q, ids['rack1-node1'] as string);
    expect(installation).toMatchObject({
      generation: 1n,
      state: 'Requested',
      imageSha256: SHA,
      compression: 'gzip',
      requestedBy: 'alice@ops',
    });
    expect(Buffer.from(installation?.userData ?? []).toString()).toBe('#cloud-config\nhostname: node1\n');
    expect((await operatorHistory(q, ids['rack1-node1'] as string)).at(-1)).toMatchObject({
      action: 'InstallOS',
      reason: 'first install',
      actor: 'alice@ops',
      detail: { generation: 1, imageUrl: 'https://images.example.com/debian-12.img.gz', userDataBytes: 30 },
    });

    // Again, by machine ID: the next generation.
    const again = await shepherd(
      ['install', '--machine-id', ids['rack1-node1'] as string, ...image, '--reason', 'again'],
      env,
    );
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('generation 2,');

    // status shows them, as text and as JSON.
    const text = await shepherd(['status'], env);
    expect(text.stdout).toMatch(/OS installations: 2\n {2}requested +2\n/);
    expect(text.stdout).toMatch(
      new RegExp(
        `${ids['rack1-node1']}  rack1-node1  2 +Requested  https://images.example.com/debian-12.img.gz onto /dev/sda`,
      ),
    );
    const json = JSON.parse((await shepherd(['status', '--json'], env)).stdout);
    expect(json.installations).toEqual({ Requested: 2, Delivered: 0, Succeeded: 0, Failed: 0, Canceled: 0 });
    expect(json.installationRequests).toContainEqual(
      expect.objectContaining({ providerId: 'rack1-node1', generation: 2, state: 'Requested', error: null }),
    );

    // --cancel withdraws; a second cancel, and an unknown machine, are refused: exit 1, naming each.
    const cancel = await shepherd(
      ['install', '--cancel', '--provider', 'Static', '--provider-id', 'rack1-node2', '--reason', 'wrong image'],
      env,
    );
    expect(cancel.code).toBe(0);
    expect(cancel.stdout).toBe(
      `canceled the installation of Static rack1-node2 (machine ${ids['rack1-node2']}), generation 1\n`,
    );
    expect((await osInstallation(q, ids['rack1-node2'] as string))?.state).toBe('Canceled');
    const refused = await shepherd(
      [
        'install',
        '--cancel',
        '--provider',
        'Static',
        '--provider-id',
        'rack1-node2',
        'rack1-node3',
        'rack9-node9',
        '--reason',
        'tidy up',
      ],
      env,
    );
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('canceled none of 3 machine(s)');
    expect(refused.stderr).toContain('rack1-node2 (machine');
    expect(refused.stderr).toContain('is canceled already');
    expect(refused.stderr).toContain('rack1-node3');
    expect(refused.stderr).toContain('no OS installation was ever requested for it');
    expect(refused.stderr).toContain('Static rack9-node9: not in the BMDB under provider Static');
  });
});

describe('install --root-device-hint', () => {
  test('names the root device by hints, repeated, beside or instead of --root-device; stored and shown', async () => {
    const env = { SHEPHERD_BMDB_URL: db.url, DEBUG: '' };
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: 'Static', providerId: 'rack2-node1' });
    const target = ['--provider', 'Static', '--provider-id', 'rack2-node1'];
    const noPath = image.filter(
      (_, i) => i !== image.indexOf('--root-device') && i !== image.indexOf('--root-device') + 1,
    );
    const hinted = await shepherd(
      [
        'install',
        ...target,
        ...noPath,
        '--root-device-hint',
        'serialNumber=S3Z1NX0K',
        '--root-device-hint',
        'minSizeGigabytes=100',
        '--root-device-hint',
        'deviceName=/dev/disk/by-path/pci-0000:00:1f.2-ata-1',
        '--root-device-hint',
        'rotational=false',
        '--reason',
        'by hints',
      ],
      env,
    );
    expect(hinted.stderr).toBe('');
    expect(hinted.code).toBe(0);
    expect(hinted.stdout).toBe(
      `requested installation of Static rack2-node1 (machine ${machineId}): generation 1, https://images.example.com/debian-12.img.gz onto deviceName=/dev/disk/by-path/pci-0000:00:1f.2-ata-1 serialNumber=S3Z1NX0K minSizeGigabytes=100 rotational=false\n`,
    );
    const hints = {
      serialNumber: 'S3Z1NX0K',
      minSizeGigabytes: 100,
      deviceName: '/dev/disk/by-path/pci-0000:00:1f.2-ata-1',
      rotational: false,
    };
    expect(await osInstallation(q, machineId)).toMatchObject({ rootDevice: undefined, rootDeviceHints: hints });
    const json = JSON.parse((await shepherd(['status', '--json'], env)).stdout);
    expect(json.installationRequests).toContainEqual(
      expect.objectContaining({ providerId: 'rack2-node1', rootDevice: null, rootDeviceHints: hints }),
    );

    const both = await shepherd(
      ['install', ...target, ...image, '--root-device-hint', 'wwn=0x5002538e40a1b2c3', '--reason', 'both'],
      env,
    );
    expect(both.code).toBe(0);
    expect(both.stdout).toContain(
      'generation 2, https://images.example.com/debian-12.img.gz onto /dev/sda wwn=0x5002538e40a1b2c3\n',
    );
    expect(await osInstallation(q, machineId)).toMatchObject({
      rootDevice: '/dev/sda',
      rootDeviceHints: { wwn: '0x5002538e40a1b2c3' },
    });
  });
});

describe('install logs', () => {
  test('name the generation as a number', async () => {
    const env = { SHEPHERD_BMDB_URL: db.url, DEBUG: 'shepherd:cli' };
    const target = ['--provider', 'Static', '--provider-id', 'rack1-node3'];
    const requested = await shepherd(['install', ...target, ...image, '--reason', 'logged'], env);
    expect(requested.code).toBe(0);
    expect(requested.stderr).toContain(
      `shepherd:cli requested installation of Static rack1-node3 (machine ${ids['rack1-node3']}), generation 1: https://images.example.com/debian-12.img.gz\n`,
    );
    const canceled = await shepherd(['install', '--cancel', ...target, '--reason', 'logged'], env);
    expect(canceled.code).toBe(0);
    expect(canceled.stderr).toContain(
      `shepherd:cli canceled the installation of Static rack1-node3 (machine ${ids['rack1-node3']}), generation 1\n`,
    );
  });
});

describe('bad input exits 2 with one line naming the flag, before anything is touched', () => {
  const targets = ['--provider', 'Static', '--provider-id', 'rack1-node3'];
  const withImage = (...change: string[]) => {
    const args = [...image];
    for (let i = 0; i < change.length; i += 2) {
      const at = args.indexOf(change[i] as string);
      if (at >= 0) args.splice(at, 2, change[i] as string, change[i + 1] as string);
      else args.push(change[i] as string, change[i + 1] as string);
    }
    return ['install', ...targets, ...args, '--reason', 'x'];
  };
  const without = (flag: string) => {
    const args = [...image];
    args.splice(args.indexOf(flag), 2);
    return ['install', ...targets, ...args, '--reason', 'x'];
  };
  // Each spawns a process of its own and touches nothing: run side by side.
  test.concurrent.each<[string, string[], RegExp]>([
    [
      'a URL that is not http(s)',
      withImage('--image-url', 'ftp://images/x.img'),
      /--image-url: invalid value "ftp:\/\/images\/x.img": want an http:\/\/ or https:\/\/ URL/,
    ],
    ['a URL that is no URL', withImage('--image-url', 'debian.img'), /--image-url: invalid value "debian.img"/],
    [
      'a sha256 too short',
      withImage('--image-sha256', 'abc123'),
      /--image-sha256: invalid value "abc123": want the image’s sha256, 64 hex digits/,
    ],
    ['a sha256 not hex', withImage('--image-sha256', 'z'.repeat(64)), /--image-sha256: invalid value "z{64}"/],
    [
      'a root device that is no absolute path',
      withImage('--root-device', 'sda'),
      /--root-device: invalid value "sda": want an absolute path/,
    ],
    [
      'an unknown compression',
      withImage('--compression', 'xz'),
      /--compression: invalid value "xz": want one of none, gzip/,
    ],
    [
      'an unreadable user-data file',
      withImage('--user-data', '/nonexistent/user-data'),
      /--user-data: cannot read "\/nonexistent\/user-data" \(ENOENT\)/,
    ],
    ['a directory as user-data', withImage('--user-data', '/'), /--user-data: cannot read "\/" \(EISDIR\)/],
    ['an empty user-data file', withImage('--user-data', '/dev/null'), /--user-data: "\/dev\/null" is empty/],
    [
      'no image URL',
      without('--image-url'),
      /--image-url: required for install \(or withdraw a request with --cancel\)/,
    ],
    ['no sha256', without('--image-sha256'), /--image-sha256: required for install/],
    ['no root device', without('--root-device'), /--root-device: required for install, or --root-device-hint/],
    [
      'a hint of an unknown field',
      withImage('--root-device-hint', 'serial=S3Z1NX0K'),
      /--root-device-hint: invalid value "serial=S3Z1NX0K": want root device hint serial: unknown; the hints are deviceName/,
    ],
    [
      'a hint with an empty value',
      withImage('--root-device-hint', 'model='),
      /--root-device-hint: invalid value "model=": want root device hint model: empty/,
    ],
    [
      'a size that is not one',
      withImage('--root-device-hint', 'minSizeGigabytes=100GB'),
      /--root-device-hint: invalid value "minSizeGigabytes=100GB": want root device hint minSizeGigabytes: want a positive whole number of GiB/,
    ],
    [
      'a size of zero',
      withImage('--root-device-hint', 'minSizeGigabytes=0'),
      /--root-device-hint: invalid value "minSizeGigabytes=0": .*positive whole number/,
    ],
    [
      'a WWN that is not hex',
      withImage('--root-device-hint', 'wwn=naa.5000'),
      /--root-device-hint: invalid value "wwn=naa.5000": .*not 0x and hex digits/,
    ],
    [
      'rotational that is not true or false',
      withImage('--root-device-hint', 'rotational=yes'),
      /--root-device-hint: invalid value "rotational=yes": .*want true or false/,
    ],
    [
      'a hint without =',
      withImage('--root-device-hint', 'S3Z1NX0K'),
      /--root-device-hint: invalid value "S3Z1NX0K": want FIELD=VALUE, such as serialNumber=S3Z1NX0K/,
    ],
    [
      'a hint given twice',
      [...withImage('--root-device-hint', 'model=a'), '--root-device-hint', 'model=b'],
      /--root-device-hint: invalid value "model=b": want model once/,
    ],
    [
      'a cancel with hints',
      ['install', '--cancel', ...targets, '--root-device-hint', 'model=a', '--reason', 'x'],
      /--root-device-hint: not with --cancel/,
    ],
    ['no reason', ['install', ...targets, ...image], /--reason: required for install: say why/],
    ['no machines', ['install', ...image, '--reason', 'x'], /--provider: required for install \(or --machine-id\)/],
    [
      'a cancel with an image',
      ['install', '--cancel', ...targets, '--image-url', 'https://x/y', '--reason', 'x'],
      /--image-url: not with --cancel/,
    ],
    ['a cancel without a reason', ['install', '--cancel', ...targets], /--reason: required for install --cancel/],
    ['a flag of another command', [...withImage(), '--graceful'], /--graceful: unknown flag for install/],
  ])('%s', async (_, args, message) => {
    const dataDir = path.join(dir, `untouched-${Math.random().toString(36).slice(2)}`);
    const result = await shepherd([...args, '--data-dir', dataDir], { DEBUG: '' });
    await expectUsageError(result, message, dataDir);
  });

  test('user-data larger than 64 KiB is refused naming the flag', async () => {
    const dataDir = path.join(dir, 'untouched-huge');
    const result = await shepherd([...withImage('--user-data', path.join(dir, 'huge')), '--data-dir', dataDir], {
      DEBUG: '',
    });
    await expectUsageError(result, /--user-data: ".*huge" is larger than 65536 bytes/, dataDir);
  });

  test('install says what it does in --help', async () => {
    const help = await shepherd(['install', '--help']);
    expect(help.code).toBe(0);
    for (const flag of [
      '--image-url',
      '--image-sha256',
      '--root-device',
      '--root-device-hint',
      '--compression',
      '--user-data',
      '--hostname',
      '--ssh-key',
      '--network',
      '--inventory',
      '--cancel',
      '--reason',
      '--provider-id',
      '--machine-id',
    ])
      expect(help.stdout).toContain(flag);
  });
});

describe('what the installed OS is given on its first boot', () => {
  const KEY_A = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';
  const KEY_B = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0st0Kq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5QeA bob@ops';
  const NETWORK = {
    interfaces: [
      {
        kind: 'device',
        name: 'eno1',
        mac: '0c:c4:7a:00:00:01',
        addresses: ['192.0.2.10/24'],
        dhcp: false,
        routes: [{ destination: '0.0.0.0/0', gateway: '192.0.2.1' }],
      },
    ],
    nameservers: ['192.0.2.53'],
  };
  const env = () => ({ SHEPHERD_BMDB_URL: db.url, DEBUG: '' });
  const machine = async (providerId: string) => {
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: 'Static', providerId });
    return machineId;
  };

  test('--hostname, --ssh-key and --network are stored with the request, handed to the agent as given', async () => {
    const machineId = await machine('rack4-node1');
    await writeFile(path.join(dir, 'keys'), `# the operators\n${KEY_A}\n\n${KEY_B}\n`);
    await writeFile(path.join(dir, 'network.json'), JSON.stringify(NETWORK));
    const result = await shepherd(
      [
        'install',
        '--provider',
        'Static',
        '--provider-id',
        'rack4-node1',
        ...image,
        '--hostname',
        'db1.example.com',
        '--ssh-key',
        path.join(dir, 'keys'),
        '--network',
        path.join(dir, 'network.json'),
        '--reason',
        'with a network',
      ],
      env(),
    );
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    expect(await osInstallation(q, machineId)).toMatchObject({
      hostname: 'db1.example.com',
      sshPublicKeys: [KEY_A, KEY_B],
      network: NETWORK,
    });
  });

  test('--inventory gives a Static machine its entry’s hostname, keys and network; the flags come first', async () => {
    const first = await machine('rack4-node2');
    const second = await machine('rack4-node3');
    const inventory = path.join(dir, 'inventory.json');
    await writeFile(
      inventory,
      JSON.stringify([
        { id: 'rack4-node2', address: '192.0.2.2', hostname: 'web2', sshPublicKeys: [KEY_A], network: NETWORK },
        { id: 'rack4-node3', address: '192.0.2.3', hostname: 'web3', sshPublicKeys: [KEY_A] },
      ]),
    );
    await writeFile(path.join(dir, 'key-b'), `${KEY_B}\n`);
    const target = ['--provider', 'Static', '--provider-id', 'rack4-node2', 'rack4-node3'];
    const result = await shepherd(
      ['install', ...target, ...image, '--inventory', inventory, '--ssh-key', path.join(dir, 'key-b'), '--reason', 'x'],
      env(),
    );
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    expect(await osInstallation(q, first)).toMatchObject({
      hostname: 'web2',
      sshPublicKeys: [KEY_B],
      network: NETWORK,
    });
    expect(await osInstallation(q, second)).toMatchObject({
      hostname: 'web3',
      sshPublicKeys: [KEY_B],
      network: undefined,
    });
  });

  const targets = ['--provider', 'Static', '--provider-id', 'rack1-node3'];
  test.concurrent.each<[string, (files: string) => Promise<string[]>, RegExp]>([
    [
      'a hostname that is none',
      async () => ['--hostname', 'node_1'],
      /--hostname: invalid value "node_1": want a hostname: letters, digits and hyphens, dots between/,
    ],
    [
      'a hostname for two machines',
      async () => ['--provider-id', 'rack1-node3', 'rack1-node2', '--hostname', 'db1'],
      /--hostname: names one machine’s: install one machine with it/,
    ],
    [
      'a key file with a line that is no key',
      async (files) => {
        await writeFile(path.join(files, 'bad-keys'), `${KEY_A}\nssh-ed25519 notbase64!\n`);
        return ['--ssh-key', path.join(files, 'bad-keys')];
      },
      /--ssh-key: ".*bad-keys": "ssh-ed25519 notbase64!" is not an OpenSSH public key/,
    ],
    [
      'a network file that is not JSON',
      async (files) => {
        await writeFile(path.join(files, 'network.yaml'), 'interfaces: []\n');
        return ['--network', path.join(files, 'network.yaml')];
      },
      /--network: ".*network.yaml" is not JSON/,
    ],
    [
      'a network with an address without its prefix',
      async (files) => {
        const bad = { ...NETWORK, interfaces: [{ ...NETWORK.interfaces[0], addresses: ['192.0.2.10'] }] };
        await writeFile(path.join(files, 'network.json'), JSON.stringify(bad));
        return ['--network', path.join(files, 'network.json')];
      },
      /--network: ".*network.json": interface eno1: address "192.0.2.10" is not an IP address\/prefix length/,
    ],
    [
      'an inventory with a bad hostname',
      async (files) => {
        await writeFile(
          path.join(files, 'inventory.json'),
          JSON.stringify([{ id: 'rack1-node3', address: '192.0.2.9', hostname: 'a b' }]),
        );
        return ['--inventory', path.join(files, 'inventory.json')];
      },
      /--inventory: .*inventory.json.*hostname.*"a b" is not a hostname/,
    ],
  ])('%s exits 2 naming the flag, touching nothing', async (_, flags, message) => {
    const files = await mkdtemp(path.join(tmpdir(), 'shepherd-install-flags-'));
    const dataDir = path.join(files, 'untouched');
    const result = await shepherd(
      ['install', ...targets, ...image, ...(await flags(files)), '--reason', 'x', '--data-dir', dataDir],
      { DEBUG: '' },
    );
    await expectUsageError(result, message, dataDir);
    await rm(files, { recursive: true, force: true });
  });

  test('a cancel neither refuses nor reads the inventory the settings name for run static', async () => {
    const machineId = await machine('rack4-node4');
    await requestOSInstallation(q, machineId, {
      imageUrl: 'https://images.example.com/debian-12.img',
      imageSha256: SHA,
      rootDevice: '/dev/sda',
      actor: 'test',
      reason: 'to cancel',
    });
    const result = await shepherd(
      ['install', '--cancel', '--provider', 'Static', '--provider-id', 'rack4-node4', '--reason', 'x'],
      { ...env(), SHEPHERD_INVENTORY: '/nonexistent/inventory.json' },
    );
    expect(result.stderr).toBe('');
    expect(result.code).toBe(0);
    expect((await osInstallation(q, machineId))?.state).toBe('Canceled');
  });

  test('a cancel with --hostname exits 2 naming it', async () => {
    const dataDir = path.join(dir, 'untouched-cancel-hostname');
    const result = await shepherd(
      ['install', '--cancel', ...targets, '--hostname', 'db1', '--reason', 'x', '--data-dir', dataDir],
      { DEBUG: '' },
    );
    await expectUsageError(result, /--hostname: not with --cancel/, dataDir);
  });
});

describe('status shows whether installed OSes booted', () => {
  const HOST_KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0st0Kq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5QeA root@db1';

  /** A Static machine installed as its agent would report it; returns it and its first-boot secret. */
  const installed = (providerId: string) =>
    installedMachine(bmdb, providerId, { actor: 'test', reason: 'status test' });

  test('booted with its time and host keys, booting, and installed-not-booted past the bound, as text and JSON', async () => {
    const booted = await installed('rack5-node1');
    const silent = await installed('rack5-node2');
    const fresh = await installed('rack5-node3');
    await recordFirstBoot(q, booted.machineId, { secret: booted.secret, hostKeys: [HOST_KEY] });
    await sql`UPDATE machine_os_installation_request SET installation_ended_at = now() - interval '31 minutes'
      WHERE machine_id = ${silent.machineId}`.execute(q);
    const env = { SHEPHERD_BMDB_URL: db.url, DEBUG: '' };
    const json = JSON.parse((await shepherd(['status', '--json'], env)).stdout);
    const bootedAt = (await osInstallation(q, booted.machineId))?.bootedAt?.toISOString();
    expect(json.firstBoots).toEqual({ booted: 1, booting: 1, 'installed-not-booted': 1 });
    expect(json.installedOSes).toContainEqual(
      expect.objectContaining({ providerId: 'rack5-node1', firstBoot: 'booted', bootedAt, hostKeys: [HOST_KEY] }),
    );
    expect(json.installedOSes).toContainEqual(
      expect.objectContaining({ providerId: 'rack5-node2', firstBoot: 'installed-not-booted', bootedAt: null }),
    );
    expect(json.installedOSes).toContainEqual(
      expect.objectContaining({ machineId: fresh.machineId, firstBoot: 'booting', hostKeys: [] }),
    );
    const text = (await shepherd(['status'], env)).stdout;
    expect(text).toMatch(
      /First boots of installed OSes: 3\n {2}booted +1\n {2}booting +1\n {2}installed-not-booted +1\n/,
    );
    const blob = Buffer.from(HOST_KEY.split(' ')[1] as string, 'base64');
    const fingerprint = createHash('sha256').update(blob).digest('base64').replace(/=+$/, '');
    expect(text).toMatch(
      new RegExp(
        `${booted.machineId}  rack5-node1 +1 +rack5-node1 +booted +${bootedAt} +ssh-ed25519 SHA256:${fingerprint.replace(/[+/]/g, '\\$&')}`,
      ),
    );
    expect(text).toMatch(
      new RegExp(`${silent.machineId}  rack5-node2 +1 +rack5-node2 +installed-not-booted +installed `),
    );
  });
});
