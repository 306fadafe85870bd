/**
 * The root README's "Working on a machine", run as written: its commands
 * block through bash, `npx shepherd` being the built binary, against a test
 * BMDB and a fake Redfish BMC over HTTPS reached through the environment
 * `run static` takes (the README's exports, pointed at the test's files).
 * And its "Installing an operating system" the same way.
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  addProvided,
  lookUpMachines,
  machineHold,
  newMachine,
  operatorHistory,
  osInstallation,
  workHistory,
} from '@bmaas/bmdb-model';
import { FakeRedfishServer, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { buildOnce } from './helpers.js';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const bin = path.join(root, 'packages/cli/bin/shepherd.js');

let dir: string;
let bmc: FakeRedfishServer;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-working-'));
  const certificate = await selfSignedCertificate();
  bmc = await FakeRedfishServer.start({ tls: certificate });
  await writeFile(path.join(dir, 'bmc-ca.pem'), certificate.cert);
  await writeFile(path.join(dir, 'bmc-password'), `${bmc.password}\n`, { mode: 0o600 });
  await writeFile(
    path.join(dir, 'inventory.json'),
    JSON.stringify([{ id: 'rack1-node07', address: '10.0.7.7', bmc: { url: bmc.addSystem('node07') } }]),
  );
  await chmod(path.join(dir, 'inventory.json'), 0o600);
  const session = await bmdb.startSession();
  await session.transact(async (q) => {
    for (const providerId of ['rack1-node07', 'rack1-node08']) {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider: 'Static', providerId });
    }
  });
  await session.close();
  // `npx shepherd …` as the README says it, running the built binary.
  await writeFile(
    path.join(dir, 'npx'),
    `#!/bin/sh\n[ "$1" = shepherd ] && shift\nexec "${process.execPath}" "${bin}" "$@"\n`,
    { mode: 0o755 },
  );
});
afterAll(async () => {
  await bmc?.close();
  await rm(dir, { recursive: true, force: true });
});

/** The ```sh blocks of the README section `title`. */
async function shellBlocks(title: string): Promise<string[]> {
  const readme = await readFile(path.join(root, 'README.md'), 'utf8');
  const start = readme.indexOf(`## ${title}\n`);
  expect(start, `README section ${title}`).toBeGreaterThanOrEqual(0);
  const end = readme.indexOf('\n## ', start + 1);
  const section = readme.slice(start, end < 0 ? undefined : end);
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((match) => match[1] as string);
}

test('the README’s "Working on a machine" runs: hold, power off, status, power on, unhold, all recorded', async () => {
  const [exports, commands] = await shellBlocks('Working on a machine');
  // The environment is the one the README exports, pointed at this test's BMDB and files.
  const variables = [...(exports ?? '').matchAll(/(SHEPHERD_[A-Z_]+)=/g)].map((match) => match[1]);
  const env: Record<string, string> = {
    SHEPHERD_BMDB_URL: db.url,
    SHEPHERD_INVENTORY: path.join(dir, 'inventory.json'),
    SHEPHERD_REDFISH_USERNAME: bmc.username,
    SHEPHERD_REDFISH_PASSWORD_FILE: path.join(dir, 'bmc-password'),
    SHEPHERD_REDFISH_CA_FILE: path.join(dir, 'bmc-ca.pem'),
  };
  expect(variables.sort()).toEqual(Object.keys(env).sort());
  expect(commands).toContain('npx shepherd hold');

  const inherited = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('SHEPHERD_')));
  const { stdout, stderr } = await promisify(execFile)('bash', ['-e', '-c', commands as string], {
    cwd: dir,
    env: { ...inherited, ...env, PATH: `${dir}:${process.env.PATH}`, SHEPHERD_ACTOR: 'tech@rack1', DEBUG: '' },
  });
  expect(stderr).toBe('');
  const lines = stdout.trim().split('\n');
  expect(lines).toHaveLength(5);
  expect(lines[0]).toMatch(/^held Static rack1-node07 \(machine [0-9a-f-]{36}\)$/);
  expect(lines[1]).toMatch(/^powered off Static rack1-node07 \(machine [0-9a-f-]{36}\): ForceOff$/);
  expect(lines[2]).toMatch(/^Static rack1-node07 \(machine [0-9a-f-]{36}\): Off$/);
  expect(lines[3]).toMatch(/^powered on Static rack1-node07 \(machine [0-9a-f-]{36}\): On$/);
  expect(lines[4]).toMatch(
    /^released Static rack1-node07 \(machine [0-9a-f-]{36}\), held by tech@rack1 since \S+: replace disk 3$/,
  );

  expect(bmc.resetsOf('node07').map((reset) => reset.resetType)).toEqual(['ForceOff', 'On']);
  expect(await bmc.powerState('node07')).toBe('On');
  const q = bmdb.db;
  const [machine] = (await lookUpMachines(q, { provider: 'Static', providerIds: ['rack1-node07'] })).found;
  const machineId = machine?.machineId as string;
  expect(await machineHold(q, machineId)).toBeUndefined();
  expect((await operatorHistory(q, machineId)).map((h) => [h.action, h.outcome, h.reason, h.actor])).toEqual([
    ['Hold', 'Succeeded', 'replace disk 3', 'tech@rack1'],
    ['PowerOff', 'Succeeded', 'replace disk 3', 'tech@rack1'],
    ['PowerOn', 'Succeeded', 'disk 3 replaced', 'tech@rack1'],
    ['Unhold', 'Succeeded', null, 'tech@rack1'],
  ]);
  expect((await workHistory(q, machineId)).map((h) => `${h.process}:${h.event}`)).toEqual([
    'ShepherdPowerAction:Started',
    'ShepherdPowerAction:Finished',
    'ShepherdPowerAction:Started',
    'ShepherdPowerAction:Finished',
  ]);
});

test('the README’s "Installing an operating system" runs: requested with who, why and the image; shown; one canceled', async () => {
  const [block] = await shellBlocks('Installing an operating system');
  const lines = (block ?? '').split('\n');
  expect(lines[0]).toMatch(/^export SHEPHERD_BMDB_URL=/);
  const commands = lines.slice(1).join('\n');
  expect(commands).toContain('npx shepherd install');
  await writeFile(path.join(dir, 'debian-12.img.gz'), 'not really an image');
  await writeFile(path.join(dir, 'node.yaml'), '#cloud-config\nhostname: rack1\n');
  // The operator's key, under this test's HOME; the inventory, this test's.
  const home = path.join(dir, 'home');
  await mkdir(path.join(home, '.ssh'), { recursive: true });
  const operatorKey = authorizedKeyLine(generateKeyPairSync('ed25519').publicKey, 'ops@rack1');
  await writeFile(path.join(home, '.ssh/id_ed25519.pub'), `${operatorKey}\n`);
  expect(commands).toContain('/etc/shepherd/inventory.json');
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('SHEPHERD_')));
  const { stdout, stderr } = await promisify(execFile)(
    'bash',
    ['-e', '-c', commands.replaceAll('/etc/shepherd/inventory.json', path.join(dir, 'inventory.json'))],
    {
      cwd: dir,
      env: {
        ...inherited,
        HOME: home,
        SHEPHERD_BMDB_URL: db.url,
        PATH: `${dir}:${process.env.PATH}`,
        SHEPHERD_ACTOR: 'ops@rack1',
        DEBUG: '',
      },
    },
  );
  expect(stderr).toBe('');
  for (const node of ['rack1-node07', 'rack1-node08']) {
    expect(stdout).toMatch(
      new RegExp(
        `^requested installation of Static ${node} \\(machine [0-9a-f-]{36}\\): generation 1, https://images.example.com/debian-12.img.gz onto /dev/sda$`,
        'm',
      ),
    );
  }
  expect(stdout).toMatch(/^OS installations: 2\n {2}requested +2$/m);
  expect(stdout).toMatch(/^canceled the installation of Static rack1-node08 \(machine [0-9a-f-]{36}\), generation 1$/m);
  const q = bmdb.db;
  const found = (await lookUpMachines(q, { provider: 'Static', providerIds: ['rack1-node07', 'rack1-node08'] })).found;
  const [node07, node08] = found.map((m) => m.machineId) as [string, string];
  const { createHash } = await import('node:crypto');
  expect(await osInstallation(q, node07)).toMatchObject({
    state: 'Requested',
    imageSha256: createHash('sha256').update('not really an image').digest('hex'),
    compression: 'gzip',
    requestedBy: 'ops@rack1',
    sshPublicKeys: [operatorKey],
  });
  expect((await osInstallation(q, node08))?.state).toBe('Canceled');
  expect((await operatorHistory(q, node08)).map((h) => [h.action, h.outcome, h.reason])).toEqual([
    ['InstallOS', 'Succeeded', 'debian 12 for team X'],
    ['CancelOSInstallation', 'Succeeded', 'wrong image'],
  ]);
});

/** An ed25519 public key as an authorized_keys line (`ssh-ed25519 AAAA… comment`). */
function authorizedKeyLine(key: KeyObject, comment: string): string {
  const raw = key.export({ type: 'spki', format: 'der' }).subarray(-32);
  const field = (bytes: Buffer) => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    return Buffer.concat([length, bytes]);
  };
  const blob = Buffer.concat([field(Buffer.from('ssh-ed25519')), field(raw)]);
  return `ssh-ed25519 ${blob.toString('base64')} ${comment}`;
}
