import { type ChildProcess, spawn } from 'node:child_process';
import { generateKeyPairSync, X509Certificate } from 'node:crypto';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  addProvided,
  newMachine,
  operatorHistory,
  osInstallation,
  retiredMachines,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { encodeTakeoverInit } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { buildOnce, shepherd } from './helpers.js';

/** The real agent's command line (packages/agent/bin/agent.js), run from its build. */
const AGENT = fileURLToPath(new URL('../../agent/bin/agent.js', import.meta.url));
const FIXTURE = fileURLToPath(new URL('../../agent/test/fixtures/two-socket-server/', import.meta.url));
const MiB = 2 ** 20;
const { db, bmdb } = await testBMDB();
const q = bmdb.db;
let server: BmaasServer;
let dir: string;
let caDer: Uint8Array;
const agents: ChildProcess[] = [];

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'decommission-wipe-'));
  const tls = await selfSignedServerTls(dir);
  caDer = new X509Certificate(tls.cert).raw;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
});

afterAll(async () => {
  for (const agent of agents) if (agent.exitCode === null) agent.kill();
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A Static machine `providerId`, the recorded two-socket server with files standing in for its `disks`. */
async function machine(providerId: string, disks: readonly string[]): Promise<{ machineId: string; root: string }> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Static', providerId });
  const root = path.join(dir, providerId);
  await cp(FIXTURE, root, { recursive: true, verbatimSymlinks: true });
  for (const disk of disks) await writeFile(path.join(root, 'dev', disk), Buffer.alloc(4 * MiB, 0xaa));
  return { machineId, root };
}

/**
 * The real agent as it runs once booted into the agent image (a takeover's kexec, or its BMC's boot):
 * `bmaas-agent run` with the hand-over on its standard input (its TakeoverInit and key), its public
 * key recorded as AgentStarted. Not a takeover that stays on the machine's OS: an agent running in
 * place refuses to wipe the disks under it.
 */
async function startAgent(machineId: string, root: string): Promise<ChildProcess> {
  const sent = { machineId, bmaasEndpoint: `localhost:${server.port}`, caCertificate: caDer };
  const { publicKey, privateKey } = generateKeyPairSync('ed25519');
  const handOver = JSON.stringify({
    init: Buffer.from(encodeTakeoverInit(sent)).toString('base64'),
    privateKey: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  });
  const child = spawn(
    process.execPath,
    [AGENT, 'run', '--root', root, '--interval', '200ms', '--log-file', `${root}.log`],
    { stdio: ['pipe', 'ignore', 'inherit'] },
  );
  agents.push(child);
  child.stdin?.end(handOver);
  // The raw ed25519 key: the last 32 bytes of its SubjectPublicKeyInfo.
  const key = new Uint8Array(publicKey.export({ type: 'spki', format: 'der' }).subarray(-32));
  await setAgentStarted(q, machineId, { publicKey: key });
  return child;
}

const exited = (child: ChildProcess) =>
  child.exitCode !== null ? Promise.resolve(child.exitCode) : new Promise((resolve) => child.on('exit', resolve));

test('decommission --wipe: a machine whose agent wiped its disks is removed; a failed wipe and a machine without an agent are kept, saying why', async () => {
  const wiped = await machine('wipe-ok', ['nvme0n1', 'sda', 'sdb']);
  // Its SATA disk's node is missing: the agent reports the wipe failed, naming it.
  const broken = await machine('wipe-broken', ['nvme0n1', 'sdb']);
  const agentless = await machine('wipe-agentless', []);
  const wipedAgent = await startAgent(wiped.machineId, wiped.root);
  await startAgent(broken.machineId, broken.root);

  const result = await shepherd([
    'decommission',
    '--wipe',
    '--bmdb-url',
    db.url,
    '--provider',
    'Static',
    '--provider-id',
    'wipe-ok,wipe-broken,wipe-agentless',
    '--reason',
    'returned to the lessor',
    '--actor',
    'tech@rack3',
  ]);
  expect(result.code, result.stderr).toBe(1);
  expect(result.stdout).toMatch(
    new RegExp(
      `wipe requested for Static wipe-broken \\(machine ${broken.machineId}\\), generation 1\n` +
        `wipe requested for Static wipe-ok \\(machine ${wiped.machineId}\\), generation 1\n` +
        `(.|\n)*wiped and removed Static wipe-ok \\(machine ${wiped.machineId}\\)\n`,
    ),
  );
  expect(result.stderr).toContain(
    `Static wipe-agentless (machine ${agentless.machineId}): no agent runs on it, so its disks cannot be wiped yet`,
  );
  // Its agent arrives over SSH: booting one through the BMC is for the machines whose inventory says so.
  expect(result.stderr).toContain(
    `wipe-agentless (machine ${agentless.machineId}): no agent runs on it, so its disks cannot be wiped yet: its agent arrives over SSH (boot method ssh), which only the initializer's takeover of a running OS starts, and its BMC boots none; kept in the BMDB`,
  );
  expect(result.stderr).not.toContain('not built yet');
  expect(result.stderr).toMatch(
    new RegExp(
      `Static wipe-broken \\(machine ${broken.machineId}\\): its wipe \\(generation 1\\) failed: disk wipe: 1 of 3 disks not wiped: /dev/sda \\(BTYF01234567480BGN\\)`,
    ),
  );

  // Removed only after its agent reported: its disks were wiped at both ends, and the agent stopped.
  expect(await osInstallation(q, wiped.machineId)).toBeUndefined();
  expect((await db.admin('SELECT 1 FROM machines WHERE machine_id = $1', [wiped.machineId])).rows).toEqual([]);
  for (const disk of ['nvme0n1', 'sda', 'sdb']) {
    const bytes = await readFile(path.join(wiped.root, 'dev', disk));
    expect(bytes.subarray(0, MiB).every((byte) => byte === 0)).toBe(true);
    expect(bytes.subarray(bytes.length - MiB).every((byte) => byte === 0)).toBe(true);
  }
  expect(await exited(wipedAgent)).toBe(0);
  // Retired, wiped: the provisioner does not bring it back from the inventory.
  expect(await retiredMachines(q, { provider: 'Static' })).toMatchObject([
    {
      providerId: 'wipe-ok',
      machineId: wiped.machineId,
      actor: 'tech@rack3',
      reason: 'returned to the lessor',
      wiped: true,
    },
  ]);
  expect(await readFile(`${wiped.root}.log`, 'utf8')).toContain('wiped; stopping');

  // Kept, visible with the agent's error; the agentless one untouched.
  expect(await osInstallation(q, broken.machineId)).toMatchObject({
    kind: 'DiskWipe',
    state: 'Failed',
    decommission: true,
  });
  expect((await osInstallation(q, broken.machineId))?.error).toContain('/dev/sda (BTYF01234567480BGN)');
  expect(await osInstallation(q, agentless.machineId)).toBeUndefined();
  const history = await operatorHistory(q, broken.machineId);
  expect(history.map((a) => [a.action, a.actor, a.reason])).toEqual([
    ['WipeDisks', 'tech@rack3', 'returned to the lessor'],
  ]);
});

test('decommission --wipe without --reason is a usage error', async () => {
  const result = await shepherd([
    'decommission',
    '--wipe',
    '--bmdb-url',
    db.url,
    '--provider',
    'Static',
    '--provider-id',
    'x',
  ]);
  expect(result.code).toBe(2);
  expect(result.stderr).toContain('--reason');
});
