/**
 * Power control through the BMC port, against the fake Redfish BMC over
 * HTTPS: reading power state (with transitions that take time, a system that
 * leaves PowerState out, a Dell-style system path), powering on, off and
 * cycling, the recoverer powering on a machine it finds off, and an
 * operator's power actions recorded in the BMDB.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseLimiter } from '@bmaas/bmdb-controlloop';
import { leasePowerReads, machineHold, operatorHistory, powerState, providedMachines } from '@bmaas/bmdb-model';
import { PowerActions, PowerSync, Provisioner, Recoverer } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually, runUntil } from '../../../test/support/wait.js';
import {
  BmcUnsupportedError,
  RedfishClient,
  RedfishHttpError,
  Secret,
  STATIC_PROVIDER,
  StaticProvider,
} from '../src/index.js';
import { powerStateOf, RedfishBmc } from '../src/redfish/bmc.js';
import { chooseAllowed } from '../src/redfish/reset-types.js';
import {
  FakeRedfishServer,
  SimulatedPower,
  selfSignedCertificate,
  type TestCertificate,
} from '../src/testing/index.js';

let dir: string;
let certificate: TestCertificate;
let bmc: FakeRedfishServer;
let redfish: RedfishClient;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'static-power-'));
  certificate = await selfSignedCertificate();
  bmc = await FakeRedfishServer.start({ tls: certificate });
  redfish = new RedfishClient({ timeout: 2_000, retryDelay: 1, ca: certificate.cert });
});
afterAll(async () => {
  await redfish.close();
  await bmc.close();
  await rm(dir, { recursive: true, force: true });
});

const fast = () => parseLimiter('1ms,1000');
const q = () => bmdb.db;

/** A static provider over an inventory of `systems` (id → the fake's system URL), all with the fake's credentials. */
async function staticFleet(name: string, systems: Record<string, string>): Promise<StaticProvider> {
  const file = path.join(dir, `${name}.json`);
  const machines = Object.entries(systems).map(([id, url], i) => ({
    id,
    address: `10.9.${name.length}.${i + 1}`,
    bmc: { url, username: bmc.username, password: bmc.password },
  }));
  await writeFile(file, JSON.stringify(machines));
  await chmod(file, 0o600);
  return new StaticProvider({ inventory: file, redfish });
}

async function provision(provider: StaticProvider): Promise<Map<string, string>> {
  const session = await bmdb.startSession();
  await new Provisioner(provider, { creationLimiter: fast() }).reconcile(session);
  await session.close();
  const provided = (await providedMachines(q(), STATIC_PROVIDER)).map((m) => [m.providerId, m.machineId] as const);
  return new Map(provided);
}

describe('the fake BMC’s power', () => {
  test('changes take the transition time; a restart of a system that is off is refused (409)', async () => {
    let now = 0;
    const power = new SimulatedPower('Off', 100, () => now);
    expect(await power.state()).toBe('Off');
    await expect(power.restart()).rejects.toThrow('the system is powered off');
    await power.on();
    expect(await power.state()).toBe('PoweringOn');
    now = 100;
    expect(await power.state()).toBe('On');

    const url = bmc.addSystem('transitions', { powerState: 'Off', powerTransition: 60_000 });
    const target = { machine: 'transitions', url, username: bmc.username, password: new Secret(bmc.password) };
    const redfishBmc = new RedfishBmc(redfish, target);
    expect(await redfishBmc.powerState()).toBe('Off');
    const refused = await redfishBmc.powerCycle().catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(RedfishHttpError);
    expect((refused as Error).message).toMatch(
      /POST answered HTTP 409: .*ForceRestart refused: the system is powered off/,
    );
    expect(await redfishBmc.powerOn()).toEqual({ command: 'On' });
    expect(await redfishBmc.powerState()).toBe('PoweringOn');
    expect(await bmc.powerState('transitions')).toBe('PoweringOn');
  });

  test('a system that leaves PowerState out reads as Unknown; a Dell-style path works like any', async () => {
    const dell = await FakeRedfishServer.start();
    try {
      const url = dell.addSystem('System.Embedded.1', { omitPowerState: true });
      expect(url).toBe(`${dell.url}/redfish/v1/Systems/System.Embedded.1`);
      const target = { machine: 'idrac', url, username: dell.username, password: new Secret(dell.password) };
      const idrac = new RedfishBmc(redfish, target);
      expect(await idrac.powerState()).toBe('Unknown');
      expect(await idrac.powerOff({ graceful: true })).toEqual({ command: 'GracefulShutdown' });
      expect(await dell.powerState('System.Embedded.1')).toBe('Off');
      dell.configureSystem('System.Embedded.1', {});
      expect(await idrac.powerState()).toBe('Off');
      // The Systems collection lists it, as a BMC's does.
      const response = await fetch(`${dell.url}/redfish/v1/Systems`, {
        headers: { authorization: `Basic ${Buffer.from(`${dell.username}:${dell.password}`).toString('base64')}` },
      });
      expect(await response.json()).toMatchObject({
        Members: [{ '@odata.id': '/redfish/v1/Systems/System.Embedded.1' }],
        'Members@odata.count': 1,
      });
    } finally {
      await dell.close();
    }
  });

  test('power on prefers On, else ForceOn; power off needs ForceOff, a graceful one GracefulShutdown', async () => {
    const target = (system: string) => ({
      machine: system,
      url: bmc.systemUrl(system),
      username: bmc.username,
      password: new Secret(bmc.password),
    });
    bmc.addSystem('force-on', { powerState: 'Off', allowableResetTypes: ['ForceOn', 'ForceOff', 'ForceRestart'] });
    expect(await new RedfishBmc(redfish, target('force-on')).powerOn()).toEqual({ command: 'ForceOn' });
    const error = await new RedfishBmc(redfish, target('force-on'))
      .powerOff({ graceful: true })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BmcUnsupportedError);
    expect(error).toMatchObject({ protocol: 'redfish' });
    expect((error as Error).message).toBe(
      `machine force-on: BMC ${bmc.systemUrl('force-on')}: no allowable reset type to shut down gracefully with ` +
        '(want GracefulShutdown; allowed: ForceOn, ForceOff, ForceRestart)',
    );
    expect(bmc.resetsOf('force-on').map((r) => r.resetType)).toEqual(['ForceOn']);
    expect(chooseAllowed({ machine: 'm', url: 'u' }, undefined, ['On', 'ForceOn'], 'power on')).toBe('On');
    expect(['On', 'Off', 'PoweringOn', 'PoweringOff', 'Paused', undefined].map(powerStateOf)).toEqual([
      'On',
      'Off',
      'PoweringOn',
      'PoweringOff',
      'Unknown',
      'Unknown',
    ]);
  });
});

describe('the static provider’s power control', () => {
  test('reads, powers off, on and cycles each machine through its BMC', async () => {
    const provider = await staticFleet('control', { c1: bmc.addSystem('c1'), c2: bmc.addSystem('c2') });
    expect(provider.type).toBe('Static');
    expect(await provider.readPowerState('c1')).toBe('On');
    expect(await provider.powerOff('c1', { graceful: false })).toEqual({ command: 'ForceOff' });
    expect(await provider.readPowerState('c1')).toBe('Off');
    expect(await provider.powerOn('c1')).toEqual({ command: 'On' });
    expect(await provider.powerCycle('c2')).toEqual({ command: 'ForceRestart' });
    expect(bmc.resetsOf('c1').map((r) => r.resetType)).toEqual(['ForceOff', 'On']);
    expect(bmc.resetsOf('c2').map((r) => r.resetType)).toEqual(['ForceRestart']);
  });

  test('the recoverer powers on a silent machine found off instead of power-cycling it', async () => {
    const provider = await staticFleet('recovery', {
      'off-node': bmc.addSystem('off-node', { powerState: 'Off' }),
      'on-node': bmc.addSystem('on-node'),
    });
    const machines = await provision(provider);
    for (const id of ['off-node', 'on-node']) {
      await db.admin(
        `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
         VALUES ($1, now() - interval '2 hours', '\\x00')`,
        [machines.get(id)],
      );
    }
    await runUntil(
      (signal) => new Recoverer(provider).run(bmdb, { parallelism: 2, claimLimiter: fast(), signal }),
      async () => (await db.admin('SELECT 1 FROM machine_agent_started')).rowCount === 0,
    );
    // A ForceRestart would have been refused (409) on the machine that was off.
    expect(bmc.resetsOf('off-node').map((r) => r.resetType)).toEqual(['On']);
    expect(bmc.resetsOf('on-node').map((r) => r.resetType)).toEqual(['ForceRestart']);
    expect(await bmc.powerState('off-node')).toBe('On');
    await db.admin('DELETE FROM machines');
  });

  test('an operator’s power actions over HTTPS, each in the history; the power sync records the states', async () => {
    const provider = await staticFleet('operator', {
      'op-1': bmc.addSystem('op-1', { powerTransition: 60_000 }),
      'op-2': bmc.addSystem('op-2', { omitPowerState: true }),
    });
    const machines = await provision(provider);
    const op1 = machines.get('op-1') as string;
    const session = await bmdb.startSession();
    const actions = new PowerActions(bmdb, provider);
    expect(await actions.take(session, op1, { action: 'off', reason: 'disk swap', actor: 'alice@ops1' })).toEqual({
      outcome: 'Succeeded',
      command: 'ForceOff',
      held: true,
    });
    expect(await actions.read(session, { machineId: op1, providerId: 'op-1' })).toEqual({ state: 'PoweringOff' });
    // Still powering off: a cycle is refused by the BMC, and the refusal is the recorded cause.
    const cycled = await actions.take(session, op1, { action: 'cycle', reason: 'try', actor: 'alice@ops1' });
    expect(cycled).toMatchObject({ outcome: 'Failed' });
    expect(cycled.outcome === 'Failed' && cycled.cause).toMatch(
      /^machine op-1: BMC https:\/\/127\.0\.0\.1:\d+\/redfish\/v1\/Systems\/op-1\/Actions\/ComputerSystem\.Reset: POST answered HTTP 409: .*ForceRestart refused: the system is powering off/,
    );
    expect(await actions.take(session, op1, { action: 'on', reason: 'done', actor: 'bob@ops2' })).toMatchObject({
      outcome: 'Succeeded',
      command: 'On',
    });
    expect((await operatorHistory(q(), op1)).map((h) => [h.action, h.outcome, h.actor])).toEqual([
      ['Hold', 'Succeeded', 'alice@ops1'],
      ['PowerOff', 'Succeeded', 'alice@ops1'],
      ['PowerCycle', 'Failed', 'alice@ops1'],
      ['PowerOn', 'Succeeded', 'bob@ops2'],
    ]);
    await session.close();

    const sync = new PowerSync(provider, { limiter: fast(), concurrency: 2, idlePoll: 10 });
    await runUntil(
      (signal) => sync.run(bmdb, { signal }),
      async () =>
        (await powerState(q(), machines.get('op-2') as string))?.state === 'Unknown' &&
        (await powerState(q(), op1))?.state === 'PoweringOn',
    );
    expect(await powerState(q(), op1)).toMatchObject({ state: 'PoweringOn', failedCause: null });
    await eventually(async () => ((await machineHold(q(), op1)) ? true : undefined));
    await db.admin('DELETE FROM machines');
  });

  test('a cycle the BMC did but answered late, or one cut short once asked, is recorded as one that may have acted', async () => {
    const provider = await staticFleet('unknown', {
      'late-1': bmc.addSystem('late-1'),
      'cut-1': bmc.addSystem('cut-1'),
    });
    const machines = await provision(provider);
    // Both read (as far as the power sync knows): due again only once an action asks for a fresh read.
    expect(await leasePowerReads(q(), { provider: STATIC_PROVIDER, limit: 10, intervalSeconds: 60 })).toHaveLength(2);
    const session = await bmdb.startSession();
    const actions = new PowerActions(bmdb, provider);
    const cycle = { action: 'cycle', reason: 'hung', actor: 'alice@ops1' } as const;
    const recorded = async (machineId: string) => {
      const last = (await operatorHistory(q(), machineId)).at(-1);
      return last && [last.action, last.outcome, last.cause, last.detail];
    };

    // The BMC restarts the machine and answers after the client's timeout: posted once, the outcome unknown.
    const late = machines.get('late-1') as string;
    bmc.fail('late-1', { method: 'POST', afterActing: true, delay: 60_000 });
    const unanswered = await actions.take(session, late, cycle);
    const cause = `machine late-1: BMC ${bmc.systemUrl('late-1')}/Actions/ComputerSystem.Reset: POST got no answer within 2000 ms (timeout); the BMC may have acted on ForceRestart: not sent again (a second one would act twice); read the power state before trying again`;
    expect(unanswered).toEqual({ outcome: 'Unknown', cause, held: false });
    expect(bmc.resetsOf('late-1')).toHaveLength(1);
    expect(await recorded(late)).toEqual(['PowerCycle', 'Failed', cause, { mayHaveActed: true }]);

    // Stopped by its caller while the BMC holds the reset.
    const cut = machines.get('cut-1') as string;
    let release = () => {};
    bmc.fail('cut-1', {
      method: 'POST',
      until: new Promise<void>((resolve) => {
        release = resolve;
      }),
    });
    const stop = new AbortController();
    const taking = actions.take(session, cut, cycle, stop.signal);
    await eventually(async () => bmc.requests.some((r) => r.system === 'cut-1' && r.method === 'POST') || undefined);
    stop.abort(new Error('the operator pressed Ctrl-C'));
    const cutShort =
      'cut short (the operator pressed Ctrl-C) once the provider was asked: it may have acted; read the power state before trying again';
    expect(await taking).toEqual({ outcome: 'Unknown', cause: cutShort, held: false });
    release();
    expect(await recorded(cut)).toEqual(['PowerCycle', 'Failed', cutShort, { mayHaveActed: true }]);

    // Both claims ended; both machines are the power sync's next reads.
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = ANY ($1::uuid[])', [[late, cut]])).rowCount).toBe(0);
    const leased = await leasePowerReads(q(), { provider: STATIC_PROVIDER, limit: 10, intervalSeconds: 60 });
    expect(leased.map((lease) => lease.machineId).sort()).toEqual([late, cut].sort());
    await session.close();
    await db.admin('DELETE FROM machines');
  });
});
