/**
 * `shepherd run static` booting a blank machine's agent through its BMC, as
 * an operator runs it: an inventory entry with `"agentBoot": "virtual-media"`
 * and no address (and so no --agent-executable-path: nothing is taken over
 * through SSH), the fake Redfish BMC over HTTPS, the boot files served by
 * the run itself (`--agent-boot-image-dir`, over a self-signed certificate),
 * the real BMaaS server, and the real agent. The test plays the machine: once
 * the BMC's CD holds the ISO and the BMC was told to boot it, it fetches the
 * ISO from the URL the BMC was given, unpacks its config initramfs and starts
 * `bmaas-agent enroll` with it. The agent enrolls; the BMC's media is ejected.
 * Bad agent boot flags exit 2 naming the flag, before anything is touched.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { FakeRedfishServer, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { smallAgentImage } from '../../../test/support/agent-image.js';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { buildOnce, eventually, expectUsageError, type Shepherd, shepherd, start } from './helpers.js';

const execute = promisify(execFile);
const agentBin = path.resolve('packages/agent/bin/agent.js');

let dir: string;
let imageDir: string;
let bmc: FakeRedfishServer;
let server: BmaasServer;
let serverCa: string;
let run: Shepherd | undefined;
let agent: ChildProcess | undefined;

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-agent-boot-'));
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
  const bmdb = await openTestBMDB(db);
  const tls = await selfSignedServerTls(dir);
  serverCa = path.join(dir, 'server-ca.pem');
  await writeFile(serverCa, tls.cert);
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  const certificate = await selfSignedCertificate();
  await writeFile(path.join(dir, 'bmc-ca.pem'), certificate.cert);
  bmc = await FakeRedfishServer.start({ tls: certificate, password: 'bmc-Pa55word' });
  await writeFile(path.join(dir, 'bmc-password'), `${bmc.password}\n`, { mode: 0o600 });
  imageDir = await smallAgentImage(dir);
});

afterAll(async () => {
  agent?.kill('SIGTERM');
  if (run && run.child.exitCode === null) {
    run.child.kill('SIGKILL');
    await run.exited;
  }
  await server?.close();
  await bmc?.close();
  await rm(dir, { recursive: true, force: true });
});

/** `run static`'s flags for the inventory in `dir`, without the agent boot's. */
function runStatic(): string[] {
  return [
    'run',
    'static',
    '--bmdb-url',
    db.url,
    '--data-dir',
    path.join(dir, 'data'),
    '--inventory',
    path.join(dir, 'inventory.json'),
    '--redfish-password-file',
    path.join(dir, 'bmc-password'),
    '--redfish-ca-file',
    path.join(dir, 'bmc-ca.pem'),
    '--ssh-key-path',
    path.join(dir, 'ssh_key'),
    '--agent-ssh-user',
    'root',
    '--agent-target-path',
    '/root/agent',
    '--agent-endpoint',
    `localhost:${server.port}`,
    '--agent-endpoint-ca-certificate-path',
    serverCa,
    '--provisioner-reconciler-rate',
    '100ms,1',
    '--power-sync-concurrency',
    '0',
  ];
}

test('run static: a blank machine is booted from virtual media, its agent enrolls, and the media is ejected', async () => {
  bmc.addSystem('blank1');
  await writeFile(
    path.join(dir, 'inventory.json'),
    JSON.stringify([
      {
        id: 'blank1',
        agentBoot: 'virtual-media',
        location: 'lab',
        bmc: { url: bmc.systemUrl('blank1'), username: bmc.username },
      },
    ]),
    { mode: 0o600 },
  );
  const port = await freePort();
  run = start([
    ...runStatic(),
    '--agent-boot-image-dir',
    imageDir,
    '--agent-boot-listen',
    `127.0.0.1:${port}`,
    '--agent-boot-url',
    `https://localhost:${port}`,
    '--agent-boot-tls-self-signed',
    '--agent-booter-db-query-rate',
    '50ms,8',
  ]);
  await run.logged(/agent boot files at https:\/\/localhost:\d+/, 60_000);
  expect(run.stderr).toContain('no initializer: no --agent-executable-path');

  // The BMC: the CD holds this boot's ISO, and the machine was told to boot it.
  const media = await eventually(
    'the BMC inserted the ISO and powered the machine',
    async () => {
      const told = bmc.told('blank1');
      return told.some((line) => line.startsWith('Reset') || line === 'Power On') && bmc.virtualMedia('blank1').inserted
        ? bmc.virtualMedia('blank1')
        : undefined;
    },
    60_000,
  );
  const told = bmc.told('blank1');
  expect(told[0]).toMatch(/^InsertMedia https:\/\/localhost:\d+\/agent-boot\/b\/[A-Za-z0-9_-]{43}\/agent\.iso/);
  expect(told[1]).toMatch(/^BootOverride Cd Once/);
  const isoUrl = media.image ?? '';
  // The run's log names the machine and the boot, never the ISO's unguessable path.
  expect(run.stderr).not.toContain(new URL(isoUrl).pathname);

  // The machine: the firmware reads the ISO (the boot files' certificate is self-signed: not checked, as BMCs do).
  const iso = path.join(dir, 'booted.iso');
  const { stdout } = await execute('curl', ['-sk', '-o', iso, '-w', '%{http_code}', isoUrl]);
  expect(stdout).toBe('200');
  await execute('xorriso', ['-osirrox', 'on', '-indev', iso, '-extract', '/boot/config.cpio', `${iso}.cpio`]);
  const root = path.join(dir, 'machine-root');
  await mkdir(root);
  await execute('sh', ['-c', `busybox cpio -i -d < "${iso}.cpio"`], { cwd: root });
  agent = spawn(
    process.execPath,
    [agentBin, 'enroll', '--enrollment', path.join(root, 'etc/bmaas/enrollment.json'), '--interval', '500ms'],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );

  // Enrolled: AgentStarted with the agent's key, heartbeats, the media ejected and the ISO gone.
  const machineId = await eventually(
    'the agent enrolled and heartbeats',
    async () => {
      const { rows } = await db.admin(
        `SELECT p.machine_id FROM machine_provided p
         JOIN machine_agent_started USING (machine_id) JOIN machine_agent_heartbeat USING (machine_id)
         WHERE p.provider = 'Static' AND p.provider_id = 'blank1'`,
      );
      return (rows[0] as { machine_id: string } | undefined)?.machine_id;
    },
    60_000,
  );
  await eventually('the media was ejected', async () => (bmc.told('blank1').includes('EjectMedia') ? true : undefined));
  expect(bmc.virtualMedia('blank1').inserted).toBe(false);
  const after = await execute('curl', ['-sk', '-o', '/dev/null', '-w', '%{http_code}', isoUrl]);
  expect(after.stdout).toBe('404');
  // The booter ejects before it ends its work: the work's end is waited for, then the whole history checked.
  const events = await eventually('the boot work ended', async () => {
    const { rows } = await db.admin(
      `SELECT event FROM work_history WHERE machine_id = $1 AND process = 'ShepherdAgentBoot' ORDER BY timestamp`,
      [machineId],
    );
    const events = rows.map((row: { event: string }) => row.event);
    return events.length > 1 ? events : undefined;
  });
  expect(events).toEqual(['Started', 'Finished']);
  // No SSH takeover was tried on a machine with no address.
  const starts = await db.admin(`SELECT 1 FROM work_history WHERE machine_id = $1 AND process = 'ShepherdAgentStart'`, [
    machineId,
  ]);
  expect(starts.rows).toEqual([]);
}, 180_000);

describe('bad agent boot flags exit 2 naming the flag, touching nothing', () => {
  test('an image directory without the image, a URL with a path, both a certificate and a self-signed one, limits that cannot hold', async () => {
    await writeFile(path.join(dir, 'inventory.json'), '[]', { mode: 0o600 });
    const empty = path.join(dir, 'empty-image');
    await mkdir(empty, { recursive: true });
    const dataDir = path.join(dir, 'untouched');
    const args = runStatic().map((arg) => (arg === path.join(dir, 'data') ? dataDir : arg));
    await expectUsageError(
      await shepherd([...args, '--agent-boot-image-dir', empty]),
      /--agent-boot-image-dir: invalid value ".*empty-image": want a directory holding vmlinuz, initramfs, agent.iso .*: vmlinuz is missing/,
      dataDir,
    );
    await expectUsageError(
      await shepherd([
        ...args,
        '--agent-boot-image-dir',
        imageDir,
        '--agent-boot-url',
        'https://shepherd.example/boot',
      ]),
      /--agent-boot-url: invalid value "https:\/\/shepherd.example\/boot": want an http:\/\/ or https:\/\/ URL without a path/,
      dataDir,
    );
    await expectUsageError(
      await shepherd([
        ...args,
        '--agent-boot-image-dir',
        imageDir,
        '--agent-boot-tls-cert',
        serverCa,
        '--agent-boot-tls-key',
        serverCa,
        '--agent-boot-tls-self-signed',
      ]),
      /--agent-boot-tls-self-signed: not with --agent-boot-tls-cert and --agent-boot-tls-key/,
      dataDir,
    );
    for (const [flag, value, message] of [
      ['--agent-boot-max-connections', '0', /--agent-boot-max-connections: invalid value "0": want a whole number/],
      ['--agent-boot-idle-timeout', '0s', /--agent-boot-idle-timeout: invalid value "0s": want a duration greater/],
      [
        '--agent-boot-idle-timeout',
        '1000h',
        /--agent-boot-idle-timeout: invalid value "1000h": want a duration of at most 596h/,
      ],
    ] as const) {
      await expectUsageError(
        await shepherd([...args, '--agent-boot-image-dir', imageDir, flag, value]),
        message,
        dataDir,
      );
    }
  });
});
