/**
 * An operator's hands on the fleet through the built CLI, each command
 * spawned as a process: `hold` and `unhold`, `power status|on|off|cycle`
 * through the static provider against a fake Redfish BMC over HTTPS (the
 * provider's flags as `run static` takes them, from the environment), through
 * the Equinix provider against the fake API, and the dummy's simulation;
 * `status` with holds and power states; and every bad input.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { hostname, tmpdir, userInfo } from 'node:os';
import path from 'node:path';
import type { Session } from '@bmaas/bmdb-controlloop';
import {
  addProvided,
  lookUpMachines,
  machineHold,
  newMachine,
  operatorHistory,
  Process,
  powerState,
} from '@bmaas/bmdb-model';
import { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { FakeRedfishServer, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { buildOnce, expectUsageError, shepherd } from './helpers.js';

let session: Session;
let dir: string;
let bmc: FakeRedfishServer;
/** The static provider's flags, as an operator's environment holds them for `run static`. */
let staticEnv: Record<string, string>;

const NODES = ['node1', 'node2', 'node3', 'node4', 'node5'];

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  await buildOnce();
  session = await bmdb.startSession({ processor: 'operator-test' });
  dir = await mkdtemp(path.join(tmpdir(), 'shepherd-operator-'));
  const certificate = await selfSignedCertificate();
  await writeFile(path.join(dir, 'bmc-ca.pem'), certificate.cert);
  bmc = await FakeRedfishServer.start({ tls: certificate, password: 'bmc-Pa55word' });
  await writeFile(path.join(dir, 'bmc-password'), `${bmc.password}\n`, { mode: 0o600 });
  const inventory = NODES.map((id, i) => ({
    id,
    address: `10.3.0.${i + 1}`,
    bmc: { url: bmc.addSystem(id, id === 'node4' ? { omitPowerState: true } : {}) },
  }));
  await writeFile(path.join(dir, 'inventory.json'), JSON.stringify(inventory));
  await chmod(path.join(dir, 'inventory.json'), 0o600);
  staticEnv = {
    SHEPHERD_BMDB_URL: db.url,
    SHEPHERD_INVENTORY: path.join(dir, 'inventory.json'),
    SHEPHERD_REDFISH_USERNAME: bmc.username,
    SHEPHERD_REDFISH_PASSWORD_FILE: path.join(dir, 'bmc-password'),
    SHEPHERD_REDFISH_CA_FILE: path.join(dir, 'bmc-ca.pem'),
    SHEPHERD_REDFISH_TIMEOUT: '5s',
    DEBUG: '',
  };
  await session.transact(async (q) => {
    for (const id of NODES) {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider: 'Static', providerId: id });
    }
  });
});
afterAll(async () => {
  await session?.close();
  await bmc?.close();
  await rm(dir, { recursive: true, force: true });
});

const q = () => bmdb.db;
const machineOf = async (providerId: string) =>
  (await lookUpMachines(q(), { provider: 'Static', providerIds: [providerId] })).found[0]?.machineId as string;
const ID = '[0-9a-f-]{36}';

describe('hold and unhold', () => {
  test('hold says which machines have work running, and leaves a held machine’s hold as it was', async () => {
    const recovery = await session.work(Process.ShepherdRecovery, async () => [await machineOf('node2')]);
    const result = await shepherd(
      ['hold', '--provider', 'Static', '--provider-id', 'node1', 'node2', '--reason', 'rack 3 maintenance'],
      { ...staticEnv, SHEPHERD_ACTOR: 'alice@ops1' },
    );
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(
      new RegExp(
        `^held Static node1 \\(machine ${ID}\\)\\n` +
          `held Static node2 \\(machine ${ID}\\); work running on it: ShepherdRecovery \\(it ends on its own\\)\\n$`,
      ),
    );
    await recovery.cancel();
    expect(await machineHold(q(), await machineOf('node1'))).toMatchObject({
      reason: 'rack 3 maintenance',
      actor: 'alice@ops1',
    });

    const again = await shepherd(
      ['hold', '--provider', 'Static', '--provider-id', 'node1', '--reason', 'other', '--actor', 'bob@ops2'],
      staticEnv,
    );
    expect(again.code).toBe(0);
    expect(again.stdout).toMatch(
      new RegExp(`^Static node1 \\(machine ${ID}\\) was already held by alice@ops1 since \\S+: rack 3 maintenance\\n$`),
    );
  });

  test('status counts and lists holds with reason, actor and age, as text and JSON', async () => {
    const text = await shepherd(['status'], staticEnv);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain('Held: 2');
    expect(text.stdout).toMatch(new RegExp(`${ID}  node1 +alice@ops1  \\d+s +rack 3 maintenance`));
    const json = await shepherd(['status', '--json'], staticEnv);
    const status = JSON.parse(json.stdout);
    expect(status.held).toBe(2);
    expect(status.holds.map((h: { providerId: string }) => h.providerId).sort()).toEqual(['node1', 'node2']);
    expect(status.holds[0]).toMatchObject({ actor: 'alice@ops1', reason: 'rack 3 maintenance', provider: 'Static' });
    expect(status.holds[0].ageSeconds).toBeGreaterThanOrEqual(0);
    expect(status.powerStates).toMatchObject({ Unread: 5 });
  });

  test('unhold by machine ID releases, says which were not held; the actor defaults to user@host', async () => {
    const node1 = await machineOf('node1');
    const node3 = await machineOf('node3');
    const result = await shepherd(['unhold', '--machine-id', node1, node3], staticEnv);
    expect(result.code).toBe(0);
    expect(result.stdout).toBe(
      `released Static node1 (machine ${node1}), held by alice@ops1 since ${(await operatorHistory(q(), node1))[0]?.timestamp.toISOString()}: rack 3 maintenance\n` +
        `Static node3 (machine ${node3}) was not held\n`,
    );
    const history = await operatorHistory(q(), node1);
    expect(history.map((h) => [h.action, h.actor])).toEqual([
      ['Hold', 'alice@ops1'],
      ['Unhold', `${userInfo().username}@${hostname()}`],
    ]);
  });

  test('unknown IDs are named and exit 1, after the others were held', async () => {
    const missing = '00000000-0000-4000-8000-000000000000';
    const byProvider = await shepherd(
      ['hold', '--provider', 'Static', '--provider-id', 'nosuch,node3', '--reason', 'x'],
      staticEnv,
    );
    expect(byProvider.code).toBe(1);
    expect(byProvider.stdout).toMatch(/^held Static node3/);
    expect(byProvider.stderr).toBe(
      'shepherd: refused 1 machine(s):\n  Static nosuch: not in the BMDB under provider Static\n',
    );
    const byMachine = await shepherd(['unhold', '--machine-id', missing, await machineOf('node3')], staticEnv);
    expect(byMachine.code).toBe(1);
    expect(byMachine.stdout).toMatch(/^released Static node3/);
    expect(byMachine.stderr).toBe(`shepherd: refused 1 machine(s):\n  machine ${missing}: not in the BMDB\n`);
  });
});

describe('power through the static provider, over HTTPS', () => {
  test('status reads each BMC and records it; a BMC that leaves PowerState out is Unknown', async () => {
    const result = await shepherd(
      ['power', 'status', '--provider', 'Static', '--provider-id', 'node3', 'node4'],
      staticEnv,
    );
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(
      new RegExp(`^Static node3 \\(machine ${ID}\\): On\\nStatic node4 \\(machine ${ID}\\): Unknown\\n$`),
    );
    expect(await powerState(q(), await machineOf('node3'))).toMatchObject({ state: 'On' });
    expect(await powerState(q(), await machineOf('node4'))).toMatchObject({ state: 'Unknown' });
  });

  test('off holds the machine and records the action; on and cycle follow; every action in the history', async () => {
    const node3 = await machineOf('node3');
    const off = await shepherd(
      [
        'power',
        'off',
        '--provider',
        'static',
        '--provider-id',
        'node3',
        '--reason',
        'swap PSU',
        '--actor',
        'carol@ops3',
      ],
      staticEnv,
    );
    expect(off.code).toBe(0);
    expect(off.stdout).toBe(
      `powered off Static node3 (machine ${node3}): ForceOff (held: a power off holds a machine; \`shepherd unhold\` releases it)\n`,
    );
    expect(await bmc.powerState('node3')).toBe('Off');
    const status = await shepherd(['power', 'status', '--provider', 'Static', '--provider-id', 'node3'], staticEnv);
    expect(status.stdout).toBe(`Static node3 (machine ${node3}): Off\n`);

    // A cycle of a machine that is off: the BMC refuses; the cause is named and exit 1.
    const cycle = await shepherd(
      ['power', 'cycle', '--provider', 'Static', '--provider-id', 'node3', '--reason', 'test', '--actor', 'carol@ops3'],
      staticEnv,
    );
    expect(cycle.code).toBe(1);
    expect(cycle.stderr).toMatch(
      new RegExp(
        `^shepherd: power cycle: not done on 1 machine\\(s\\):\\n  Static node3 \\(machine ${node3}\\): power cycle failed: machine node3: BMC https://127\\.0\\.0\\.1:\\d+/redfish/v1/Systems/node3/Actions/ComputerSystem\\.Reset: POST answered HTTP 409: .*ForceRestart refused: the system is powered off\\n$`,
      ),
    );

    const on = await shepherd(
      [
        'power',
        'on',
        '--provider',
        'Static',
        '--provider-id',
        'node3',
        '--reason',
        'PSU swapped',
        '--actor',
        'carol@ops3',
      ],
      staticEnv,
    );
    expect(on.stdout).toBe(`powered on Static node3 (machine ${node3}): On\n`);
    const graceful = await shepherd(
      ['power', 'off', '--graceful', '--provider', 'Static', '--provider-id', 'node3', '--reason', 'again'],
      staticEnv,
    );
    expect(graceful.stdout).toContain('): GracefulShutdown\n');
    expect(graceful.stdout).not.toContain('held:'); // already held: no new hold
    expect(bmc.resetsOf('node3').map((r) => r.resetType)).toEqual(['ForceOff', 'On', 'GracefulShutdown']);

    const history = await operatorHistory(q(), node3);
    expect(history.slice(-5).map((h) => [h.action, h.outcome, h.reason])).toEqual([
      ['Hold', 'Succeeded', 'swap PSU'],
      ['PowerOff', 'Succeeded', 'swap PSU'],
      ['PowerCycle', 'Failed', 'test'],
      ['PowerOn', 'Succeeded', 'PSU swapped'],
      ['PowerOff', 'Succeeded', 'again'],
    ]);
    expect((await machineHold(q(), node3))?.reason).toBe('swap PSU');
  });

  test('refused while a recovery runs, failed for a BMC that refuses, unknown IDs: all named, exit 1, the rest done', async () => {
    const recovery = await session.work(Process.ShepherdRecovery, async () => [await machineOf('node1')]);
    bmc.fail('node2', { status: 401, times: 10 });
    try {
      const result = await shepherd(
        [
          'power',
          'cycle',
          '--provider',
          'Static',
          '--provider-id',
          'node1',
          'node2',
          'node5',
          'nosuch',
          '--reason',
          'x',
        ],
        staticEnv,
      );
      expect(result.code).toBe(1);
      expect(result.stdout).toMatch(new RegExp(`^power-cycled Static node5 \\(machine ${ID}\\): ForceRestart\\n$`));
      const lines = result.stderr.trim().split('\n');
      expect(lines[0]).toBe('shepherd: power cycle: not done on 3 machine(s):');
      expect(lines[1]).toMatch(
        /^ {2}Static node1 \(machine \S+\): power cycle refused: work is running on it \(ShepherdRecovery\); try again once it ended$/,
      );
      expect(lines[2]).toMatch(
        /^ {2}Static node2 \(machine \S+\): power cycle failed: machine node2: BMC .*: BMC refused the credentials of user "admin" \(HTTP 401\)$/,
      );
      expect(lines[3]).toBe('  Static nosuch: not in the BMDB under provider Static');
      expect(result.stderr).not.toContain(bmc.password);
    } finally {
      bmc.clearFaults();
      await recovery.cancel();
    }
    expect((await operatorHistory(q(), await machineOf('node1'))).at(-1)).toMatchObject({
      action: 'PowerCycle',
      outcome: 'Refused',
    });
  });
});

describe('power actions settle each on its own', () => {
  test('a database error of one machine stops no other action: each gets its line and its history', async () => {
    const [failing, slow] = [await machineOf('node1'), await machineOf('node5')];
    // The first machine's outcome cannot be written; the sequence, outside any transaction, says when that happened.
    await db.admin(`
      CREATE SEQUENCE injected_failures;
      CREATE FUNCTION injected_failure() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.machine_id = '${failing}' AND NEW.action = 'PowerCycle' THEN
          PERFORM nextval('injected_failures');
          RAISE EXCEPTION 'injected: no room for the operator history';
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER injected_failure BEFORE INSERT ON operator_history
        FOR EACH ROW EXECUTE FUNCTION injected_failure();`);
    let release = () => {};
    // The other machine's BMC holds its reset until the first has failed.
    bmc.fail('node5', {
      method: 'POST',
      until: new Promise<void>((resolve) => {
        release = resolve;
      }),
    });
    const resets = { node1: bmc.resetsOf('node1').length, node5: bmc.resetsOf('node5').length };
    const earlier = bmc.requests.length;
    try {
      const running = shepherd(
        [
          'power',
          'cycle',
          '--provider',
          'Static',
          '--provider-id',
          'node1',
          'node5',
          '--reason',
          'hung',
          '--actor',
          'dave@ops4',
        ],
        { ...staticEnv, SHEPHERD_REDFISH_TIMEOUT: '60s' },
      );
      await eventually('the first machine’s failure', async () => {
        const { rows } = await db.admin('SELECT is_called FROM injected_failures');
        return rows[0].is_called === true || undefined;
      });
      await eventually(
        'the other machine’s reset at its BMC',
        async () => bmc.requests.slice(earlier).some((r) => r.system === 'node5' && r.method === 'POST') || undefined,
      );
      release();
      const result = await running;
      expect(result.code).toBe(1);
      expect(result.stdout).toBe(`power-cycled Static node5 (machine ${slow}): ForceRestart\n`);
      expect(result.stderr).toMatch(
        new RegExp(
          `^shepherd: power cycle: not done on 1 machine\\(s\\):\\n  Static node1 \\(machine ${failing}\\): power cycle: machine ${failing}: PowerCycle \\(ForceRestart\\) could not be recorded: injected: no room for the operator history \\(P0001\\); the provider may have acted\\n$`,
        ),
      );
      expect(bmc.resetsOf('node1')).toHaveLength(resets.node1 + 1);
      expect(bmc.resetsOf('node5')).toHaveLength(resets.node5 + 1);
      expect((await operatorHistory(q(), slow)).at(-1)).toMatchObject({
        action: 'PowerCycle',
        outcome: 'Succeeded',
        actor: 'dave@ops4',
      });
      // Neither claim is left behind.
      const { rowCount } = await db.admin('SELECT 1 FROM work WHERE machine_id = ANY ($1::uuid[])', [[failing, slow]]);
      expect(rowCount).toBe(0);
    } finally {
      release();
      bmc.clearFaults();
      await db.admin(`
        DROP TRIGGER injected_failure ON operator_history;
        DROP FUNCTION injected_failure();
        DROP SEQUENCE injected_failures;`);
    }
  });
});

describe('power status beside a power action', () => {
  test('a slow status read does not record the state it read over a power off that completed meanwhile', async () => {
    const node2 = await machineOf('node2');
    let release = () => {};
    // The BMC reads the system at once (On) and answers only once the power off below completed.
    bmc.fail('node2', {
      method: 'GET',
      afterActing: true,
      until: new Promise<void>((resolve) => {
        release = resolve;
      }),
    });
    const env = { ...staticEnv, SHEPHERD_REDFISH_TIMEOUT: '60s' };
    const earlier = bmc.requests.length;
    try {
      const status = shepherd(['power', 'status', '--provider', 'Static', '--provider-id', 'node2'], env);
      await eventually(
        'the status read at the BMC',
        async () => bmc.requests.slice(earlier).some((r) => r.system === 'node2' && r.method === 'GET') || undefined,
      );
      const off = await shepherd(
        ['power', 'off', '--provider', 'Static', '--provider-id', 'node2', '--reason', 'cabling'],
        env,
      );
      expect(off.stdout).toContain(`powered off Static node2 (machine ${node2}): ForceOff`);
      release();
      const read = await status;
      // What the BMC said when asked, shown; not recorded: a state may have been recorded since it began.
      expect(read.stdout).toBe(`Static node2 (machine ${node2}): On\n`);
      expect((await powerState(q(), node2))?.state).not.toBe('On');
      // The power sync reads the machine next, rather than an interval later.
      const { rows } = await db.admin('SELECT power_checked_at FROM machine_power_state WHERE machine_id = $1', [
        node2,
      ]);
      expect(rows).toEqual([{ power_checked_at: null }]);
    } finally {
      release();
      bmc.clearFaults();
    }
    expect(await bmc.powerState('node2')).toBe('Off');
  });
});

describe('power through the other providers', () => {
  test('Equinix: device actions through the API; no graceful power off, said by name', async () => {
    const api = await FakeEquinixApi.start();
    try {
      const device = api.addDevice({ hostname: 'ops-device' });
      await session.transact(async (q) => {
        const machineId = await newMachine(q);
        await addProvided(q, machineId, { provider: 'Equinix', providerId: device.id });
      });
      const env = {
        SHEPHERD_BMDB_URL: db.url,
        SHEPHERD_EQUINIX_API_URL: api.url,
        SHEPHERD_EQUINIX_API_KEY: api.apiKey,
        SHEPHERD_EQUINIX_PROJECT_ID: api.projectId,
        DEBUG: '',
      };
      const ids = ['--provider', 'Equinix', '--provider-id', device.id];
      const off = await shepherd(['power', 'off', ...ids, '--reason', 'r'], env);
      expect(off.code).toBe(0);
      expect(off.stdout).toMatch(/^powered off Equinix \S+ \(machine \S+\): power_off \(held/);
      expect((await shepherd(['power', 'status', ...ids], env)).stdout).toMatch(/: Off\n$/);
      expect((await shepherd(['power', 'on', ...ids, '--reason', 'r'], env)).stdout).toMatch(/: power_on\n$/);
      const graceful = await shepherd(['power', 'off', '--graceful', ...ids, '--reason', 'r'], env);
      expect(graceful.code).toBe(1);
      expect(graceful.stderr).toContain(
        'power off failed: provider Equinix does not implement a graceful power off (the API has power_off only)',
      );
      expect(api.actions(device.id)).toEqual(['power_off', 'power_on']);
      expect(off.stderr + graceful.stderr).not.toContain(api.apiKey);
    } finally {
      await api.close();
    }
  });

  test('Dummy: simulated, in the command’s own process', async () => {
    await session.transact(async (q) => {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider: 'Dummy', providerId: 'dummy-000007' });
    });
    const ids = ['--provider', 'Dummy', '--provider-id', 'dummy-000007', '--bmdb-url', db.url];
    const status = await shepherd(['power', 'status', ...ids], { DEBUG: '' });
    expect(status.stdout).toMatch(/^Dummy dummy-000007 \(machine \S+\): On\n$/);
    const cycle = await shepherd(['power', 'cycle', ...ids, '--reason', 'demo'], { DEBUG: '' });
    expect(cycle.stdout).toMatch(/^power-cycled Dummy dummy-000007 \(machine \S+\): simulated power cycle\n$/);
  });
});

describe('bad input exits 2 with one line naming the flag, before anything is touched', () => {
  const targets = ['--provider', 'Static', '--provider-id', 'node1'];
  // Each spawns a process of its own and touches nothing: run side by side.
  test.concurrent.each<[string, string[], RegExp]>([
    ['hold without a reason', ['hold', ...targets], /--reason: required for hold: say why/],
    ['hold with a blank reason', ['hold', ...targets, '--reason', '  '], /--reason: required for hold/],
    [
      'hold without machines',
      ['hold', '--reason', 'x'],
      /--provider: required for hold \(or --machine-id\): the provider of the machines/,
    ],
    [
      'hold without provider IDs',
      ['hold', '--provider', 'Static', '--reason', 'x'],
      /--provider-id: required for hold \(or --machine-id\)/,
    ],
    [
      'a machine ID that is no UUID',
      ['hold', '--machine-id', 'node1', '--reason', 'x'],
      /--machine-id: invalid value "node1": want a machine ID \(a UUID\)/,
    ],
    [
      'machine IDs and provider IDs both',
      ['unhold', '--machine-id', '00000000-0000-4000-8000-000000000000', ...targets],
      /--machine-id: name the machines by --machine-id or by --provider and --provider-id, not both/,
    ],
    ['unhold without machines', ['unhold'], /--provider: required for unhold/],
    ['power without a command', ['power', ...targets], /^shepherd: power: say what to do: status, on, off or cycle/],
    [
      'power with an unknown command',
      ['power', 'reboot', ...targets],
      /^shepherd: power: unknown command "reboot": want status, on, off or cycle/,
    ],
    ['power on without a reason', ['power', 'on', ...targets], /--reason: required for power on: say why/],
    ['power cycle without a reason', ['power', 'cycle', ...targets], /--reason: required for power cycle/],
    ['power off without a reason', ['power', 'off', '--graceful', ...targets], /--reason: required for power off/],
    [
      '--graceful with power on',
      ['power', 'on', '--graceful', ...targets, '--reason', 'x'],
      /--graceful: only for power off, not power on/,
    ],
    [
      'a provider the shepherd does not control',
      ['power', 'status', '--provider', 'Bench', '--provider-id', 'b1'],
      /--provider: invalid value "Bench": want a provider whose power the shepherd controls: Dummy, Equinix or Static/,
    ],
    [
      'power without provider IDs',
      ['power', 'status', '--provider', 'Static'],
      /--provider-id: required for power status/,
    ],
    [
      'the static provider without an inventory',
      ['power', 'status', ...targets],
      /--inventory: required for power status --provider Static \(or set SHEPHERD_INVENTORY\)/,
    ],
    [
      'the Equinix provider without its API key',
      ['power', 'status', '--provider', 'Equinix', '--provider-id', 'd1', '--equinix-project-id', 'p1'],
      /--equinix-api-key: required for power status --provider Equinix/,
    ],
    ['an unknown flag', ['power', 'status', ...targets, '--hard'], /--hard: unknown flag for power/],
    [
      'a flag of run only',
      ['hold', ...targets, '--reason', 'x', '--inventory', 'x.json'],
      /--inventory: unknown flag for hold/,
    ],
    ['a word too many', ['hold', 'now', ...targets, '--reason', 'x'], /^shepherd: hold: unexpected argument "now"/],
  ])('%s', async (_, args, message) => {
    const dataDir = path.join(dir, `untouched-${Math.random().toString(36).slice(2)}`);
    const result = await shepherd([...args, '--data-dir', dataDir], { DEBUG: '' });
    await expectUsageError(result, message, dataDir);
  });

  test('every command says what it does in --help', async () => {
    for (const command of ['hold', 'unhold', 'power']) {
      const help = await shepherd([command, '--help']);
      expect(help.code).toBe(0);
      for (const flag of ['--provider', '--provider-id', '--reason', '--actor', '--bmdb-url'])
        expect(help.stdout).toContain(flag);
    }
    expect((await shepherd(['power', '--help'])).stdout).toContain('--inventory');
    expect((await shepherd(['hold', '--help'])).stdout).toContain('--machine-id');
  });
});
