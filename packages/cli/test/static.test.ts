/**
 * `shepherd run static` end to end, as an operator runs it: the real CLI
 * process over an inventory of loopback addresses (127.0.0.x) served by one
 * real SSH server (OpenSSH when installed, else ssh2's in-process server),
 * the real test agent started on each, and a fake Redfish BMC over HTTPS
 * verified with --redfish-ca-file. Two machines are made silent; exactly those
 * two are reset through the BMC, with the reset type each BMC prefers, and
 * their agents started again. The inventory is edited while it runs: a good
 * edit is taken on the next pass, a bad one changes nothing and is logged.
 */
import { chmod, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import path from 'node:path';
import { FakeRedfishServer, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { startTestSshServer, type TestSshServer } from '../../../test/support/sshd.js';
import { buildOnce, eventually, expectUsageError, type Shepherd, shepherd, start } from './helpers.js';

const ADDRESSES = ['127.0.0.1', '127.0.0.2', '127.0.0.3', '127.0.0.4', '127.0.0.5', '127.0.0.6', '127.0.0.7'];
const testAgent = path.resolve('packages/shepherd-manager/bin/test-agent.js');

let dir: string;
let sshd: TestSshServer;
let bmc: FakeRedfishServer;
let run: Shepherd | undefined;

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-static-'));
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
  // The operator's step: the shepherd's public key onto the machines.
  const key = await shepherd(['ssh-key', '--ssh-key-path', path.join(dir, 'ssh_key')]);
  expect(key.code).toBe(0);
  sshd = await startTestSshServer({ authorizedKeys: [key.stdout.trim()], listenAddresses: ADDRESSES });
  console.log(sshd.description);
  const certificate = await selfSignedCertificate();
  await writeFile(path.join(dir, 'bmc-ca.pem'), certificate.cert);
  bmc = await FakeRedfishServer.start({ tls: certificate, password: 'bmc-Pa55word' });
  await writeFile(path.join(dir, 'bmc-password'), `${bmc.password}\n`, { mode: 0o600 });
});
afterAll(async () => {
  if (run && run.child.exitCode === null) {
    run.child.kill('SIGKILL');
    await run.exited;
  }
  await sshd?.stop();
  await bmc?.close();
  await rm(dir, { recursive: true, force: true });
});

interface Entry {
  readonly id: string;
  readonly address: string;
}

/** Writes the inventory as an editor would save it: whole, in one rename. */
async function writeInventory(content: string | readonly Entry[]): Promise<void> {
  const text =
    typeof content === 'string'
      ? content
      : JSON.stringify(
          content.map(({ id, address }) => ({
            id,
            address,
            location: 'lab',
            bmc: { url: bmc.systemUrl(id), username: bmc.username },
          })),
          null,
          2,
        );
  const temporary = path.join(dir, 'inventory.json.tmp');
  await writeFile(temporary, text);
  await chmod(temporary, 0o600);
  await rename(temporary, path.join(dir, 'inventory.json'));
}

const entry = (n: number): Entry => ({ id: `node${n}`, address: ADDRESSES[n - 1] as string });

interface Row {
  provider_id: string;
  machine_id: string;
  provider_ip_address: string;
  agent_started_at: Date | null;
  agent_public_key: Buffer | null;
}

async function machines(): Promise<Map<string, Row>> {
  const { rows } = await db.admin(
    `SELECT p.provider_id, p.machine_id, p.provider_ip_address, a.agent_started_at, a.agent_public_key
     FROM machine_provided p LEFT JOIN machine_agent_started a USING (machine_id)
     WHERE p.provider = 'Static' ORDER BY p.provider_id`,
  );
  return new Map((rows as Row[]).map((row) => [row.provider_id, row]));
}

/** Resolves once every one of `ids` has its agent started (and `extra` holds). */
function allStarted(ids: readonly string[], extra: (rows: Map<string, Row>) => boolean = () => true) {
  return eventually(async () => {
    const rows = await machines();
    return ids.every((id) => rows.get(id)?.agent_started_at) && extra(rows) ? rows : undefined;
  }, 60_000);
}

test('run static: inventory to running fleet, silent machines reset through the BMC, inventory edits while running', async () => {
  for (let n = 1; n <= 6; n++) bmc.addSystem(`node${n}`);
  // node2's BMC cannot ForceRestart: it gets its next preference.
  bmc.configureSystem('node2', { allowableResetTypes: ['On', 'ForceOff', 'GracefulRestart', 'PowerCycle'] });
  await writeInventory([1, 2, 3, 4].map(entry));

  const started = performance.now();
  run = start([
    'run',
    'static',
    '--bmdb-url',
    db.url,
    '--inventory',
    path.join(dir, 'inventory.json'),
    '--redfish-password-file',
    path.join(dir, 'bmc-password'),
    '--redfish-ca-file',
    path.join(dir, 'bmc-ca.pem'),
    '--ssh-key-path',
    path.join(dir, 'ssh_key'),
    '--agent-ssh-user',
    userInfo().username,
    '--agent-ssh-port',
    String(sshd.port),
    '--agent-ssh-connect-timeout',
    '5s',
    '--agent-executable-path',
    testAgent,
    '--agent-target-path',
    path.join(dir, 'agent'),
    '--agent-endpoint',
    'bmaas.example.com:443',
    '--provisioner-reconciler-rate',
    '100ms,1',
    '--provisioner-device-creation-rate',
    '1ms,100',
    '--initializer-db-query-rate',
    '50ms,8',
    '--recoverer-db-query-rate',
    '50ms,8',
    '--power-sync-interval',
    '1s',
    // The machines are not really rebooted: nothing to wait for.
    '--static-reboot-wait',
    '0s',
  ]);

  const running = run.logged(/running with the static provider/, 60_000).then(() => performance.now() - started);

  // 1. Every machine of the inventory provided, at its address, and its agent started over SSH.
  const first = await allStarted(['node1', 'node2', 'node3', 'node4']);
  const upMs = performance.now() - started;
  console.log(
    `run static: 4 machines from start to all agents started in ${Math.round(upMs)} ms ` +
      `(process running after ${Math.round(await running)} ms; agents started one at a time over ${sshd.kind})`,
  );
  expect([...first.keys()]).toEqual(['node1', 'node2', 'node3', 'node4']);
  for (const [id, row] of first) expect(row.provider_ip_address).toBe(entry(Number(id.slice(4))).address);
  expect(bmc.resets).toEqual([]);

  // 2. node2 and node4 go silent: no first heartbeat an hour after their start.
  const silent = ['node2', 'node4'];
  await db.admin(
    "UPDATE machine_agent_started SET agent_started_at = now() - interval '1 hour' WHERE machine_id = ANY($1)",
    [silent.map((id) => first.get(id)?.machine_id)],
  );
  const silencedAt = performance.now();
  const restarted = await allStarted(silent, (rows) =>
    silent.every((id) => {
      const row = rows.get(id);
      return row?.agent_public_key && !row.agent_public_key.equals(first.get(id)?.agent_public_key ?? Buffer.alloc(0));
    }),
  );
  console.log(
    `run static: 2 silent machines reset through the BMC and their agents started again in ${Math.round(performance.now() - silencedAt)} ms; resets: ${bmc.resets.map((r) => `${r.system}:${r.resetType}`).join(', ')}`,
  );
  expect(bmc.resets.map((r) => [r.system, r.resetType]).sort()).toEqual([
    ['node2', 'PowerCycle'],
    ['node4', 'ForceRestart'],
  ]);
  for (const id of silent) {
    const { rows } = await db.admin(
      "SELECT event FROM work_history WHERE machine_id = $1 AND process = 'ShepherdRecovery' ORDER BY timestamp",
      [restarted.get(id)?.machine_id],
    );
    expect(rows.map((r: { event: string }) => r.event)).toEqual(['Started', 'Finished']);
  }
  // The others kept their agents.
  for (const id of ['node1', 'node3']) {
    expect(restarted.get(id)?.agent_public_key?.equals(first.get(id)?.agent_public_key ?? Buffer.alloc(0))).toBe(true);
  }

  // 3. A machine added to the inventory is provided on a next pass, and its agent started.
  await writeInventory([1, 2, 3, 4, 5].map(entry));
  await allStarted(['node5']);

  // 4. A bad edit: the pass fails naming the cause, nothing in the BMDB changes.
  const before = await machines();
  await writeInventory([...[1, 2, 3, 4, 5].map(entry), { id: 'node3', address: '127.0.0.6' }]);
  await run.logged(
    /reconciliation failed: inventory .*inventory\.json: entry 5 \(id "node3"\), field id: duplicate id: entry 2 has it too/,
  );
  // The power sync reads BMCs (GET) all along; nothing else may be asked of them.
  const posts = () => bmc.requests.filter((request) => request.method !== 'GET').length;
  const bmcRequestsBefore = posts();
  expect(await machines()).toEqual(before);

  // 5. The next good edit is taken: node6 added, node1 moved to another address.
  await writeInventory([{ id: 'node1', address: '127.0.0.7' }, ...[2, 3, 4, 5, 6].map(entry)]);
  const after = await allStarted(['node6'], (rows) => rows.get('node1')?.provider_ip_address === '127.0.0.7');
  expect([...after.keys()]).toEqual(['node1', 'node2', 'node3', 'node4', 'node5', 'node6']);
  expect(posts()).toBe(bmcRequestsBefore); // no BMC was asked to act meanwhile
  expect(bmc.resets).toHaveLength(2);
  // The power sync read and recorded every machine's power state.
  await eventually(async () => {
    const { rows } = await db.admin(
      `SELECT count(*)::int AS n FROM machine_power_state ps JOIN machine_provided p USING (machine_id)
       WHERE p.provider = 'Static' AND ps.power_state = 'On'`,
    );
    return rows[0].n === 6 ? true : undefined;
  });

  // 6. A clean stop: nothing claimed, sessions closed.
  run.child.kill('SIGTERM');
  const result = await run.exited;
  expect(result.code).toBe(0);
  const count = async (sql: string) => (await db.admin(sql)).rows[0].n as number;
  expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
  expect(await count('SELECT count(*)::int AS n FROM sessions')).toBe(0);
  // The BMC password never shows in the logs.
  expect(result.stderr).not.toContain(bmc.password);
  expect(result.stderr).toMatch(/machine node2: BMC accepted PowerCycle/);
});

test('run static refuses a bad inventory at start-up with exit 2, naming it', async () => {
  await writeInventory('[{"ID": "m1", "Addr": "10.0.0.1"}, {"ID": "m2", "Addr": "not-an-ip"}]');
  const result = await shepherd([
    'run',
    'static',
    '--bmdb-url',
    db.url,
    '--inventory',
    path.join(dir, 'inventory.json'),
    '--agent-executable-path',
    testAgent,
    '--agent-endpoint',
    'bmaas.example.com:443',
  ]);
  expect(result.code).toBe(2);
  expect(result.stderr).toContain(
    `shepherd: --inventory: inventory ${path.join(dir, 'inventory.json')}: entry 1 (id "m2"), field Addr: want an IPv4 or IPv6 literal, got "not-an-ip"`,
  );
});

test('decommission removes machines gone from the inventory; refuses unknown ones', async () => {
  const result = await shepherd([
    'decommission',
    '--bmdb-url',
    db.url,
    '--provider',
    'Static',
    '--provider-id',
    'node5',
    'node6',
    'nosuch',
  ]);
  expect(result.code).toBe(1);
  expect(result.stdout).toMatch(
    /^removed Static node5 \(machine [0-9a-f-]{36}\)\nremoved Static node6 \(machine [0-9a-f-]{36}\)\n$/,
  );
  expect(result.stderr).toContain('refused 1 machine(s):\n  Static nosuch: not in the BMDB under provider Static');
  expect([...(await machines()).keys()]).toEqual(['node1', 'node2', 'node3', 'node4']);
  // The history of a removed machine stays.
  const { rows } = await db.admin(
    'SELECT count(*)::int AS n FROM work_history h WHERE NOT EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = h.machine_id)',
  );
  expect(rows[0].n).toBeGreaterThanOrEqual(4);
});

describe('run static: bad input exits 2 with one line naming the flag, before anything is touched', () => {
  const base = () => [
    'run',
    'static',
    '--inventory',
    path.join(dir, 'good.json'),
    '--agent-executable-path',
    testAgent,
    '--agent-endpoint',
    'bmaas.example.com:443',
  ];
  beforeAll(async () => {
    await writeFile(path.join(dir, 'good.json'), '[{"id": "n1", "address": "10.0.0.1"}]');
    await writeFile(path.join(dir, 'open-password'), 'hunter2\n', { mode: 0o644 });
    await chmod(path.join(dir, 'open-password'), 0o644);
    await writeFile(path.join(dir, 'not-a-cert.pem'), 'hello\n');
  });

  test.each<[string, () => string[], Record<string, string>, RegExp]>([
    [
      'no inventory',
      () => ['run', 'static', '--agent-executable-path', testAgent, '--agent-endpoint', 'x:1'],
      {},
      /--inventory: required for run static \(or set SHEPHERD_INVENTORY\)/,
    ],
    [
      'no agent executable while a machine of the inventory arrives over SSH',
      () =>
        base().filter((arg, i, all) => arg !== '--agent-executable-path' && all[i - 1] !== '--agent-executable-path'),
      {},
      /--agent-executable-path: required for run static: machine n1 of the inventory .*good\.json arrives over SSH \(agentBoot ssh, the default\), which uploads it \(or set SHEPHERD_AGENT_EXECUTABLE_PATH\)/,
    ],
    [
      'a missing inventory file',
      () => [...base().slice(0, 3), path.join(dir, 'nope.json'), ...base().slice(4)],
      {},
      /--inventory: inventory .*nope\.json: cannot read \(ENOENT\)/,
    ],
    [
      'an inventory URL of another scheme',
      () => [...base().slice(0, 3), 'ftp://10.0.0.1/fleet.json', ...base().slice(4)],
      {},
      /--inventory: inventory ftp:\/\/10\.0\.0\.1\/fleet\.json: want a file path or an http:\/\/ or https:\/\/ URL/,
    ],
    [
      'a bad inventory from the environment',
      () => base().slice(0, 2).concat(base().slice(4)),
      { SHEPHERD_INVENTORY: '/nonexistent/inventory.json' },
      /--inventory: inventory \/nonexistent\/inventory\.json: cannot read \(ENOENT\)/,
    ],
    [
      'an unknown reset type',
      () => [...base(), '--redfish-reset-type', 'Reboot'],
      {},
      /--redfish-reset-type: invalid value "Reboot": want one of On, ForceOff, GracefulShutdown, GracefulRestart, ForceRestart/,
    ],
    [
      'a password file readable by others',
      () => [...base(), '--redfish-password-file', path.join(dir, 'open-password')],
      {},
      /--redfish-password-file: ".*open-password" is readable by group or others \(mode 0644\); chmod 600 it/,
    ],
    [
      'an IPMI password file readable by others',
      () => [...base(), '--ipmi-password-file', path.join(dir, 'open-password')],
      {},
      /--ipmi-password-file: ".*open-password" is readable by group or others \(mode 0644\); chmod 600 it/,
    ],
    [
      'an IPMI password file that does not exist',
      () => [...base(), '--ipmi-password-file', path.join(dir, 'no-such-password')],
      {},
      /--ipmi-password-file: .*no-such-password/,
    ],
    [
      'a CA file that is no certificate',
      () => [...base(), '--redfish-ca-file', path.join(dir, 'not-a-cert.pem')],
      {},
      /--redfish-ca-file: ".*not-a-cert\.pem" holds no PEM certificate/,
    ],
    [
      'a bad Redfish timeout',
      () => [...base(), '--redfish-timeout', 'soon'],
      {},
      /--redfish-timeout: invalid value "soon": want a duration/,
    ],
    [
      'a bad Redfish concurrency',
      () => [...base(), '--redfish-concurrency', '0'],
      {},
      /--redfish-concurrency: invalid value "0": want a whole number from 1 to 1000/,
    ],
    [
      'a bad IPMI timeout',
      () => [...base(), '--ipmi-timeout', 'soon'],
      {},
      /--ipmi-timeout: invalid value "soon": want a duration/,
    ],
    [
      'a bad IPMI concurrency',
      () => [...base(), '--ipmi-concurrency', '0'],
      {},
      /--ipmi-concurrency: invalid value "0": want a whole number from 1 to 1000/,
    ],
  ])('%s', async (_, args, env, message) => {
    const dataDir = path.join(dir, `untouched-${Math.random().toString(36).slice(2)}`);
    const result = await shepherd([...args(), '--data-dir', dataDir], env);
    await expectUsageError(result, message, dataDir);
  });

  test('decommission without provider IDs', async () => {
    const result = await shepherd(['decommission', '--provider', 'Static', '--data-dir', path.join(dir, 'untouched')]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('--provider-id: required for decommission');
  });
});
