import { parseLimiter } from '@bmaas/bmdb-controlloop';
import {
  holdMachine,
  leasePowerReads,
  machineHold,
  operatorHistory,
  Process,
  powerState,
  providedMachine,
  providedMachines,
  unholdMachine,
  workHistory,
} from '@bmaas/bmdb-model';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually, runUntil } from '../../../test/support/wait.js';
import { PowerActions, PowerSync, Provisioner, Recoverer } from '../src/index.js';
import { TestPower, TestProvider } from './test-provider.js';

const { db, bmdb } = await testBMDB();

const fast = () => parseLimiter('1ms,1000');
const q = () => bmdb.db;
const operator = { reason: 'swap the PSU', actor: 'alice@ops1' };
let providers = 0;

/** `count` machines of a fresh TestProvider (its own name) with a TestPower of the same name. */
async function fleet(count: number): Promise<{ provider: TestProvider; power: TestPower; machines: string[] }> {
  const provider = new TestProvider(count);
  Object.assign(provider, { type: `PowerTest${++providers}` });
  const session = await bmdb.startSession();
  await new Provisioner(provider, { maxCount: count, chunkSize: count, creationLimiter: fast() }).reconcile(session);
  await session.close();
  const machines = (await providedMachines(q(), provider.type)).map((m) => m.machineId);
  return { provider, power: new TestPower(provider.type), machines };
}

const providerId = async (machineId: string) => (await providedMachine(q(), machineId))?.providerId as string;

/** Makes the machines' agents silent for 2 hours: recovery candidates, by moving time in the database. */
async function silence(machines: readonly string[]): Promise<void> {
  for (const machineId of machines) {
    await db.admin(
      `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
       VALUES ($1, now() - interval '2 hours', '\\x00')`,
      [machineId],
    );
  }
}

const started = async (machineId: string) =>
  (await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId])).rowCount === 1;

const runRecoverer = (recoverer: Recoverer, done: () => Promise<boolean>) =>
  runUntil((signal) => recoverer.run(bmdb, { parallelism: 2, claimLimiter: fast(), signal }), done, {
    timeout: 20_000,
  });

describe('the recoverer and holds', () => {
  test('leaves a silent held machine alone, and recovers it after unhold', async () => {
    const { provider, machines } = await fleet(2);
    const [held, other] = machines as [string, string];
    await silence([held, other]);
    await bmdb.startSession().then(async (s) => {
      await s.transact((q) => holdMachine(q, held, operator));
      await s.close();
    });
    // The other silent machine is recovered; the held one is not, however long the loop runs.
    await runRecoverer(new Recoverer(provider), async () => !(await started(other)));
    expect(provider.powerCycles).toEqual([await providerId(other)]);
    expect(await started(held)).toBe(true);
    expect((await workHistory(q(), held)).map((h) => h.process)).toEqual([]);

    await bmdb.startSession().then(async (s) => {
      await s.transact((q) => unholdMachine(q, held, { actor: 'alice@ops1' }));
      await s.close();
    });
    await runRecoverer(new Recoverer(provider), async () => !(await started(held)));
    expect(provider.powerCycles).toEqual([await providerId(other), await providerId(held)]);
    expect((await operatorHistory(q(), held)).map((h) => h.action)).toEqual(['Hold', 'Unhold']);
  });
});

describe('the recoverer and power', () => {
  test('powers on a silent machine found off instead of power-cycling it, and power-cycles one found on', async () => {
    const { power, machines } = await fleet(2);
    const [off, on] = machines as [string, string];
    power.states.set(await providerId(off), 'Off');
    await silence([off, on]);
    await runRecoverer(new Recoverer(power), async () => !(await started(off)) && !(await started(on)));
    expect(power.actions.filter((action) => action.startsWith('on '))).toEqual([`on ${await providerId(off)}`]);
    expect(power.actions.filter((action) => action.startsWith('cycle '))).toEqual([`cycle ${await providerId(on)}`]);
    expect((await workHistory(q(), off)).map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Finished',
    ]);
  });

  test('a machine whose power state cannot be read is power-cycled all the same', async () => {
    const { power, machines } = await fleet(1);
    const [machineId] = machines as [string];
    power.unreadable.set(await providerId(machineId), 'BMC unreachable');
    await silence([machineId]);
    await runRecoverer(new Recoverer(power), async () => !(await started(machineId)));
    expect(power.actions).toEqual([`cycle ${await providerId(machineId)}`]);
  });

  test('after the power cycle, the wait holds the recovery until it passes or the stop comes', async () => {
    const { power, machines } = await fleet(2);
    const [waiting, quick] = machines as [string, string];
    await silence([waiting]);
    const stop = new AbortController();
    const recovering = new Recoverer(power, { powerCycleWait: 3_600_000 }).run(bmdb, {
      parallelism: 1,
      claimLimiter: fast(),
      stopGracePeriod: 1,
      signal: stop.signal,
    });
    await eventually(async () => (power.actions.length === 1 ? true : undefined));
    expect(power.actions).toEqual([`cycle ${await providerId(waiting)}`]);
    expect(await started(waiting)).toBe(true); // the cycle accepted, still waiting
    stop.abort(new Error('stopping')); // its task's signal aborts once the (1 ms) grace period ends
    await recovering;
    expect(await started(waiting)).toBe(true); // stopped while waiting: not counted as recovered
    expect((await workHistory(q(), waiting)).map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Canceled',
    ]);

    // A wait that passes: recovered.
    await silence([quick]);
    await runRecoverer(new Recoverer(power, { powerCycleWait: 1 }), async () => !(await started(quick)));
    expect(power.actions).toContain(`cycle ${await providerId(quick)}`);
    expect(() => new Recoverer(power, { powerCycleWait: -1 })).toThrow(/power cycle wait must be >= 0 ms/);
  });
});

describe('power actions', () => {
  test('on, off and cycle through the provider, each in the operator history; off holds the machine', async () => {
    const { power, machines } = await fleet(1);
    const [machineId] = machines as [string];
    const id = await providerId(machineId);
    const actions = new PowerActions(bmdb, power);
    const session = await bmdb.startSession({ processor: 'test-power' });

    expect(await actions.take(session, machineId, { action: 'off', ...operator })).toEqual({
      outcome: 'Succeeded',
      command: 'test off',
      held: true,
    });
    expect(await machineHold(q(), machineId)).toMatchObject({ reason: 'swap the PSU', actor: 'alice@ops1' });
    // Held: power actions go on; power on does not release the hold.
    expect(await actions.take(session, machineId, { action: 'on', reason: 'PSU swapped', actor: 'bob@ops2' })).toEqual({
      outcome: 'Succeeded',
      command: 'test on',
      held: false,
    });
    expect(
      await actions.take(session, machineId, { action: 'off', graceful: true, reason: 'again', actor: 'bob@ops2' }),
    ).toMatchObject({ outcome: 'Succeeded', command: 'test shutdown', held: false });
    expect(await machineHold(q(), machineId)).toMatchObject({ reason: 'swap the PSU' });
    await actions.take(session, machineId, { action: 'on', reason: 'back', actor: 'bob@ops2' });
    expect(await actions.take(session, machineId, { action: 'cycle', reason: 'test', actor: 'bob@ops2' })).toEqual({
      outcome: 'Succeeded',
      command: 'test cycle',
      held: false,
    });
    expect(power.actions).toEqual([`off ${id}`, `on ${id}`, `shutdown ${id}`, `on ${id}`, `cycle ${id}`]);

    const history = await operatorHistory(q(), machineId);
    expect(history.map((h) => [h.action, h.outcome, h.reason, h.actor, h.detail])).toEqual([
      ['Hold', 'Succeeded', 'swap the PSU', 'alice@ops1', { impliedBy: 'PowerOff' }],
      ['PowerOff', 'Succeeded', 'swap the PSU', 'alice@ops1', { graceful: false, command: 'test off' }],
      ['PowerOn', 'Succeeded', 'PSU swapped', 'bob@ops2', { command: 'test on' }],
      ['PowerOff', 'Succeeded', 'again', 'bob@ops2', { graceful: true, command: 'test shutdown' }],
      ['PowerOn', 'Succeeded', 'back', 'bob@ops2', { command: 'test on' }],
      ['PowerCycle', 'Succeeded', 'test', 'bob@ops2', { command: 'test cycle' }],
    ]);
    expect((await workHistory(q(), machineId)).map((h) => `${h.process}:${h.event}`)).toEqual(
      Array(5).fill(['ShepherdPowerAction:Started', 'ShepherdPowerAction:Finished']).flat(),
    );
    await session.close();
  });

  test('a failed action names the cause and is recorded; a provider that cannot act says so by name', async () => {
    const { power, machines } = await fleet(1);
    const [machineId] = machines as [string];
    const id = await providerId(machineId);
    const actions = new PowerActions(bmdb, power);
    const session = await bmdb.startSession();
    power.states.set(id, 'Off');
    expect(await actions.take(session, machineId, { action: 'cycle', ...operator })).toEqual({
      outcome: 'Failed',
      cause: `test BMC of ${id}: cannot cycle a machine that is off`,
      held: false,
    });
    // A power off that fails still holds the machine: the operator is at work on it.
    power.failing.set(id, 'BMC refused the credentials');
    expect(await actions.take(session, machineId, { action: 'off', ...operator })).toEqual({
      outcome: 'Failed',
      cause: 'BMC refused the credentials',
      held: true,
    });
    const history = await operatorHistory(q(), machineId);
    expect(history.map((h) => [h.action, h.outcome, h.cause])).toEqual([
      ['PowerCycle', 'Failed', `test BMC of ${id}: cannot cycle a machine that is off`],
      ['Hold', 'Succeeded', null],
      ['PowerOff', 'Failed', 'BMC refused the credentials'],
    ]);
    // The claim ended all the same: nothing stays claimed.
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = $1', [machineId])).rowCount).toBe(0);
    await session.close();
  });

  test('is refused, naming the work, while a recovery runs on the machine; no hold is placed', async () => {
    const { power, machines } = await fleet(1);
    const [machineId] = machines as [string];
    const recoverer = await bmdb.startSession({ processor: 'shepherd-recoverer' });
    const recovery = await recoverer.work(Process.ShepherdRecovery, async () => [machineId]);
    const session = await bmdb.startSession();
    const result = await new PowerActions(bmdb, power).take(session, machineId, { action: 'off', ...operator });
    expect(result).toEqual({
      outcome: 'Refused',
      cause: 'work is running on it (ShepherdRecovery); try again once it ended',
      busyWith: ['ShepherdRecovery'],
    });
    expect(power.actions).toEqual([]);
    expect(await machineHold(q(), machineId)).toBeUndefined();
    expect((await operatorHistory(q(), machineId)).map((h) => [h.action, h.outcome, h.cause])).toEqual([
      ['PowerOff', 'Refused', 'work is running on it (ShepherdRecovery); try again once it ended'],
    ]);
    await recovery.finish();
    expect(await new PowerActions(bmdb, power).take(session, machineId, { action: 'off', ...operator })).toMatchObject({
      outcome: 'Succeeded',
    });
    await Promise.all([session.close(), recoverer.close()]);
  });

  test('a succeeded action makes the machine the power sync’s next read; status reads and records', async () => {
    const { power, machines } = await fleet(1);
    const [machineId] = machines as [string];
    const id = await providerId(machineId);
    const session = await bmdb.startSession();
    const actions = new PowerActions(bmdb, power);
    expect(await actions.read(session, { machineId, providerId: id })).toEqual({ state: 'On' });
    expect(await powerState(q(), machineId)).toMatchObject({ state: 'On' });
    expect(await leasePowerReads(q(), { provider: power.type, limit: 1, intervalSeconds: 60 })).toEqual([]);
    await actions.take(session, machineId, { action: 'off', ...operator });
    const [next] = await leasePowerReads(q(), { provider: power.type, limit: 1, intervalSeconds: 60 });
    expect(next?.machineId).toBe(machineId);
    power.failing.set(id, 'BMC timeout');
    expect(await actions.read(session, { machineId, providerId: id })).toEqual({ failure: 'BMC timeout' });
    expect(await powerState(q(), machineId)).toMatchObject({ state: 'On', failedCause: 'BMC timeout' });
    await session.close();
  });
});

describe('the power sync', () => {
  test('reads every machine, held ones too, at a bounded concurrency, and records states and failures', async () => {
    const { power, machines } = await fleet(12);
    const ids = await Promise.all(machines.map(providerId));
    power.states.set(ids[0] as string, 'Off');
    power.states.set(ids[1] as string, 'PoweringOn');
    power.failing.set(ids[2] as string, 'BMC unreachable');
    await bmdb.startSession().then(async (s) => {
      await s.transact((q) => holdMachine(q, machines[3] as string, operator));
      await s.close();
    });
    let release: () => void = () => {};
    power.gate = new Promise((resolve) => {
      release = resolve;
    });
    const sync = new PowerSync(power, { concurrency: 3, limiter: fast(), interval: 60_000, idlePoll: 10 });
    await runUntil(
      (signal) => sync.run(bmdb, { signal }),
      async () => {
        if (power.inFlight === 3) release();
        const { rows } = await db.admin(
          `SELECT count(*)::int AS n FROM machine_power_state
           WHERE machine_id = ANY ($1::uuid[]) AND (power_state IS NOT NULL OR power_read_failed_at IS NOT NULL)`,
          [machines],
        );
        return rows[0].n === 12;
      },
      { timeout: 20_000 },
    );
    expect(power.peakInFlight).toBe(3);
    expect(power.reads).toBe(12); // each once: the interval has not passed
    expect(await powerState(q(), machines[0] as string)).toMatchObject({ state: 'Off' });
    expect(await powerState(q(), machines[1] as string)).toMatchObject({ state: 'PoweringOn' });
    expect(await powerState(q(), machines[2] as string)).toMatchObject({ state: null, failedCause: 'BMC unreachable' });
    expect(await powerState(q(), machines[3] as string)).toMatchObject({ state: 'On' });
    expect((await powerState(q(), machines[3] as string))?.readAt).toBeInstanceOf(Date);
  });

  test('reads no faster than its limiter allows, and a machine again once the interval passed', async () => {
    const { power, machines } = await fleet(6);
    // One token every 50 ms, a bucket of one: six reads take at least five refills (a loaded machine is only slower).
    const sync = new PowerSync(power, { limiter: parseLimiter('50ms,1'), concurrency: 3, idlePoll: 10 });
    const began = performance.now();
    await runUntil(
      (signal) => sync.run(bmdb, { signal }),
      async () => power.reads >= 6,
    );
    expect(performance.now() - began).toBeGreaterThanOrEqual(5 * 50 - 5);

    // Once the interval passed (moved in the database), a machine read is due again.
    const again = new PowerSync(power, { limiter: fast(), interval: 60_000, idlePoll: 10 });
    expect(await again.syncOne(bmdb)).toBeUndefined();
    await db.admin(
      `UPDATE machine_power_state SET power_checked_at = now() - interval '2 minutes' WHERE machine_id = $1`,
      [machines[4]],
    );
    expect(await again.syncOne(bmdb)).toMatchObject({ lease: { machineId: machines[4] }, result: { state: 'On' } });
    expect(await again.syncOne(bmdb)).toBeUndefined();
  });
});
