import { parseLimiter } from '@bmaas/bmdb-controlloop';
import { providedMachines, setAgentStarted } from '@bmaas/bmdb-model';
import {
  AgentBootError,
  Availability,
  Initializer,
  MachineNotFoundError,
  ProviderDiscrepancyError,
  Provisioner,
  Recoverer,
} from '@bmaas/shepherd-manager';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually, runUntil } from '../../../test/support/wait.js';
import { DummyPower } from '../src/dummy-power.js';
import { type AgentStartEvent, DUMMY_PROVIDER, DummyProvider, HeartbeatSimulator } from '../src/index.js';

const { db, bmdb } = await testBMDB();

const fast = () => parseLimiter('1ms,1000');
const provisioner = (provider: DummyProvider, maxCount: number) =>
  new Provisioner(provider, { maxCount, chunkSize: 1000, reconcileLimiter: fast(), creationLimiter: fast() });
const initializer = (provider: DummyProvider) =>
  new Initializer(provider, {
    agentExecutable: new Uint8Array([1]),
    agentEndpoint: 'bmaas.example.com:443',
    sshClient: provider.sshClient,
  });

async function reset(): Promise<void> {
  await db.admin('DELETE FROM machines');
}

const count = async (sql: string) => (await db.admin(sql)).rows[0].n as number;

describe('DummyProvider', () => {
  test('lists its capacity as deterministic slots and knows each one', async () => {
    const provider = new DummyProvider({ capacity: 3 });
    const machines = await provider.listMachines();
    expect(machines).toEqual([
      {
        id: 'dummy-000000',
        address: '10.0.0.1',
        availability: Availability.PossiblyUsed,
        failed: false,
        agentBoot: 'ssh',
        macs: [],
      },
      {
        id: 'dummy-000001',
        address: '10.0.0.2',
        availability: Availability.PossiblyUsed,
        failed: false,
        agentBoot: 'ssh',
        macs: [],
      },
      {
        id: 'dummy-000002',
        address: '10.0.0.3',
        availability: Availability.PossiblyUsed,
        failed: false,
        agentBoot: 'ssh',
        macs: [],
      },
    ]);
    expect(await provider.getMachine('dummy-000002')).toMatchObject({ address: '10.0.0.3', availability: 'KnownUsed' });
    await expect(provider.getMachine('dummy-000003')).rejects.toBeInstanceOf(MachineNotFoundError);
    await expect(provider.getMachine('equinix-1')).rejects.toThrow('provider Dummy has no machine equinix-1');
    await expect(provider.powerCycle('dummy-9')).rejects.toBeInstanceOf(MachineNotFoundError);
    expect(() => new DummyProvider({ capacity: -1 })).toThrow(/capacity must be a whole number/);
    expect(() => new DummyProvider({ capacity: 1, agentFailureRate: 2 })).toThrow(
      /agent failure rate must be between 0 and 1, got 2/,
    );
  });

  test('a shepherd restarted over the same BMDB carries on without a discrepancy', async () => {
    await reset();
    const session = await bmdb.startSession();
    const first = await provisioner(new DummyProvider({ capacity: 10 }), 4).reconcile(session);
    expect(first.created).toEqual(['dummy-000000', 'dummy-000001', 'dummy-000002', 'dummy-000003']);
    // A new process: a new provider object, nothing remembered but the BMDB.
    const second = await provisioner(new DummyProvider({ capacity: 10 }), 6).reconcile(session);
    expect(second.managed).toBe(4);
    expect(second.created).toEqual(['dummy-000004', 'dummy-000005']);
    // Shrinking capacity below what the BMDB holds is a discrepancy, named.
    await expect(provisioner(new DummyProvider({ capacity: 5 }), 6).reconcile(session)).rejects.toThrow(
      ProviderDiscrepancyError,
    );
    await expect(provisioner(new DummyProvider({ capacity: 5 }), 6).reconcile(session)).rejects.toThrow('dummy-000005');
    const stored = await providedMachines(bmdb.db, DUMMY_PROVIDER);
    expect(stored[0]).toMatchObject({ providerIpAddress: '10.0.0.1', providerStatus: 'Running' });
    await session.close();
  });

  test('the fake agent starts agents, and fails the chosen share of starts', async () => {
    await reset();
    const healthy = new DummyProvider({ capacity: 5 });
    const session = await bmdb.startSession();
    await provisioner(healthy, 5).reconcile(session);
    await session.close();
    await runUntil(
      (signal) => initializer(healthy).run(bmdb, { claimLimiter: fast(), signal }),
      async () => (await count('SELECT count(*)::int AS n FROM machine_agent_started')) === 5,
    );

    await reset();
    const failing = new DummyProvider({ capacity: 3, agentFailureRate: 0.5, random: () => 0.4 });
    const setup = await bmdb.startSession();
    await provisioner(failing, 3).reconcile(setup);
    await setup.close();
    await runUntil(
      (signal) => initializer(failing).run(bmdb, { claimLimiter: fast(), signal }),
      async () => (await count('SELECT count(*)::int AS n FROM work_backoff')) === 3,
    );
    const { rows } = await db.admin('SELECT cause FROM work_backoff');
    for (const row of rows) {
      expect(row.cause).toMatch(
        /agent reported an error: simulated failure \(dummy provider, agent failure rate 0.5\)/,
      );
    }
    expect(await count('SELECT count(*)::int AS n FROM machine_agent_started')).toBe(0);
  });
});

test('a slow fake agent takes its time, and every start is told as it begins and ends', async () => {
  await reset();
  const events: AgentStartEvent[] = [];
  const provider = new DummyProvider({
    capacity: 2,
    agentStartDuration: 300,
    agentFailureRate: 0.5,
    random: (() => {
      let n = 0;
      return () => (n++ === 0 ? 0.9 : 0.1); // the first start succeeds, the second fails
    })(),
    onAgentStart: (event) => events.push(event),
  });
  expect(() => new DummyProvider({ capacity: 1, agentStartDuration: -1 })).toThrow(/start duration must be >= 0/);
  const session = await bmdb.startSession();
  await provisioner(provider, 2).reconcile(session);
  await session.close();
  const started = Date.now();
  await runUntil(
    (signal) => initializer(provider).run(bmdb, { claimLimiter: fast(), signal, parallelism: 2 }),
    async () =>
      (await count('SELECT count(*)::int AS n FROM machine_agent_started')) +
        (await count('SELECT count(*)::int AS n FROM work_backoff')) ===
      2,
  );
  expect(Date.now() - started).toBeGreaterThanOrEqual(300);
  const machines = (await db.admin('SELECT machine_id FROM machine_provided ORDER BY 1')).rows.map((r) => r.machine_id);
  expect(events.map((e) => e.phase).sort()).toEqual(['begin', 'begin', 'end', 'end']);
  expect([...new Set(events.map((e) => e.machineId))].sort()).toEqual(machines);
  expect(
    events
      .filter((e) => e.phase === 'end')
      .map((e) => e.outcome)
      .sort(),
  ).toEqual(['failed', 'started']);
  for (const machine of machines) {
    const [begin, end] = events.filter((e) => e.machineId === machine);
    expect(end?.at.getTime() ?? 0).toBeGreaterThanOrEqual((begin?.at.getTime() ?? 0) + 290);
    expect(begin?.address).toMatch(/^10\.0\.0\.[12]$/);
  }
});

describe('HeartbeatSimulator', () => {
  async function startAgents(provider: DummyProvider, n: number): Promise<void> {
    await reset();
    const session = await bmdb.startSession();
    await provisioner(provider, n).reconcile(session);
    await session.transact(async (q) => {
      for (const m of await providedMachines(q, DUMMY_PROVIDER))
        await setAgentStarted(q, m.machineId, { publicKey: new Uint8Array(32) });
    });
    await session.close();
  }

  test('heartbeats for the agents that heartbeat, the same ones every round', async () => {
    const provider = new DummyProvider({ capacity: 200, heartbeatFailureRate: 0.5 });
    await startAgents(provider, 200);
    expect(await count('SELECT count(*)::int AS n FROM machine_agent_started')).toBe(200);
    const session = await bmdb.startSession();
    const simulator = new HeartbeatSimulator(provider);
    const beating = await simulator.beat(session);
    expect(beating).toBeGreaterThan(60);
    expect(beating).toBeLessThan(140);
    const first = (await db.admin('SELECT machine_id FROM machine_agent_heartbeat ORDER BY 1')).rows;
    expect(await simulator.beat(session)).toBe(beating);
    expect((await db.admin('SELECT machine_id FROM machine_agent_heartbeat ORDER BY 1')).rows).toEqual(first);
    await session.close();
  });

  test('failure rate 0 heartbeats all, 1 none', async () => {
    await startAgents(new DummyProvider({ capacity: 10 }), 10);
    const session = await bmdb.startSession();
    expect(await new HeartbeatSimulator(new DummyProvider({ capacity: 10 })).beat(session)).toBe(10);
    await db.admin('DELETE FROM machine_agent_heartbeat');
    expect(
      await new HeartbeatSimulator(new DummyProvider({ capacity: 10, heartbeatFailureRate: 1 })).beat(session),
    ).toBe(0);
    await session.close();
  });
});

test('the whole shepherd over the dummy: silent agents are power-cycled and started again', async () => {
  await reset();
  const provider = new DummyProvider({ capacity: 20, heartbeatFailureRate: 0.3 });
  const stop = new AbortController();
  const { signal } = stop;
  const options = { claimLimiter: fast(), signal, parallelism: 4 };
  const running = Promise.all([
    provisioner(provider, 20).run(bmdb, { signal }),
    initializer(provider).run(bmdb, options),
    // Thresholds in seconds, not minutes, so recovery shows within the test.
    new Recoverer(provider, { firstHeartbeatWithin: 1_000, heartbeatWithin: 1_000 }).run(bmdb, options),
    new HeartbeatSimulator(provider, { interval: 200 }).run(bmdb, { signal }),
  ]);
  try {
    await eventually('a power cycle', async () => (provider.powerCycles.size > 0 ? true : undefined), 15_000);
    // A silent agent's machine got power-cycled and its agent started again (with a new start, a new chance).
    await eventually(
      'an agent started again',
      async () => {
        const restarted = await count(`
          SELECT count(*)::int AS n FROM (
            SELECT machine_id FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Finished'
            GROUP BY machine_id HAVING count(*) >= 2) r`);
        return restarted > 0 ? true : undefined;
      },
      15_000,
    );
  } finally {
    stop.abort();
    await running;
  }
  expect(provider.powerCycles.size).toBeGreaterThan(0);
  expect(await count('SELECT count(*)::int AS n FROM machine_provided')).toBe(20);
  expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
  const recovered = await count(`
    SELECT count(*)::int AS n FROM (
      SELECT machine_id FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Finished'
      GROUP BY machine_id HAVING count(*) >= 2) r`);
  expect(recovered).toBeGreaterThan(0);
});

describe('simulated power', () => {
  test('every machine is On; changes take the transition time; a machine off cannot be cycled', async () => {
    let now = 0;
    const power = new DummyPower(1_000, () => now);
    expect(power.state('a')).toBe('On');
    power.off('a');
    expect(power.state('a')).toBe('PoweringOff');
    now = 999;
    expect(power.state('a')).toBe('PoweringOff');
    now = 1_000;
    expect(power.state('a')).toBe('Off');
    expect(() => power.cycle('a')).toThrow('dummy machine a is off: it cannot be power-cycled');
    power.off('a'); // already off: nothing changes
    expect(power.state('a')).toBe('Off');
    power.on('a');
    expect(power.state('a')).toBe('PoweringOn');
    now = 2_000;
    expect(power.state('a')).toBe('On');
    power.cycle('a');
    expect(power.state('a')).toBe('PoweringOn');
    expect(power.state('b')).toBe('On');
    expect(() => new DummyPower(-1)).toThrow(/transition must be >= 0 ms/);
  });

  test('the provider’s power control knows its slots only, and counts its power cycles', async () => {
    const provider = new DummyProvider({ capacity: 2 });
    expect(await provider.readPowerState('dummy-000001')).toBe('On');
    expect(await provider.powerOff('dummy-000001', { graceful: true })).toEqual({ command: 'simulated shutdown' });
    expect(await provider.readPowerState('dummy-000001')).toBe('Off');
    await expect(provider.powerCycle('dummy-000001')).rejects.toThrow(/is off: it cannot be power-cycled/);
    expect(await provider.powerOn('dummy-000001')).toEqual({ command: 'simulated power on' });
    expect(await provider.powerCycle('dummy-000001')).toEqual({ command: 'simulated power cycle' });
    await provider.powerCycle('dummy-000001');
    expect(provider.powerCycles.get('dummy-000001')).toBe(2);
    for (const call of [
      () => provider.readPowerState('dummy-000002'),
      () => provider.powerOn('x'),
      () => provider.powerOff('x', { graceful: false }),
      () => provider.powerCycle('x'),
    ]) {
      await expect(call()).rejects.toBeInstanceOf(MachineNotFoundError);
    }
  });

  test('a pretend agent boot keeps the media, powers on a machine found off and cycles one found on', async () => {
    const provider = new DummyProvider({ capacity: 2, agentBoot: 'network' });
    expect((await provider.listMachines())[1]).toMatchObject({ agentBoot: 'network', macs: ['02:00:0a:00:00:02'] });
    await provider.powerOff('dummy-000001', { graceful: false });
    const media = { isoUrl: 'https://shepherd.example/agent-boot/x/agent.iso' };
    expect(await provider.bootAgent('dummy-000001', media)).toEqual({
      method: 'network',
      detail: 'simulated network boot; simulated power on',
    });
    expect(await provider.readPowerState('dummy-000001')).toBe('On');
    expect(await provider.bootAgent('dummy-000001', media)).toMatchObject({ detail: /simulated power cycle$/ });
    expect(provider.powerCycles.get('dummy-000001')).toBe(1);
    expect(provider.agentBootMedia.get('dummy-000001')).toEqual(media);
    // Another boot's end leaves this boot's media; its own removes it.
    await provider.endAgentBoot('dummy-000001', { method: 'network', media: { isoUrl: `${media.isoUrl}.old` } });
    expect(provider.agentBootMedia.get('dummy-000001')).toEqual(media);
    await provider.endAgentBoot('dummy-000001', { method: 'network', media });
    expect(provider.agentBootMedia.has('dummy-000001')).toBe(false);

    const cd = new DummyProvider({ capacity: 1, agentBoot: 'virtual-media' });
    expect(await cd.bootAgent('dummy-000000', media)).toEqual({
      method: 'virtual-media',
      detail: 'simulated virtual media; simulated power cycle',
    });
    expect((await cd.getMachine('dummy-000000')).macs).toEqual([]);
    await expect(cd.bootAgent('dummy-000001', media)).rejects.toBeInstanceOf(MachineNotFoundError);

    const ssh = new DummyProvider({ capacity: 1 });
    const refused = ssh.bootAgent('dummy-000000', media);
    await expect(refused).rejects.toBeInstanceOf(AgentBootError);
    await expect(refused).rejects.toThrow('machine dummy-000000: the agent cannot be booted: the dummy provider');
    expect(ssh.powerCycles.size).toBe(0);
  });

  test('the recoverer powers on a silent machine found off, instead of power-cycling it', async () => {
    await reset();
    const provider = new DummyProvider({ capacity: 2 });
    const session = await bmdb.startSession();
    await provisioner(provider, 2).reconcile(session);
    await session.close();
    await db.admin(
      `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
       SELECT machine_id, now() - interval '2 hours', '\\x00' FROM machine_provided WHERE provider = 'Dummy'`,
    );
    await provider.powerOff('dummy-000000', { graceful: false });
    await runUntil(
      (signal) => new Recoverer(provider).run(bmdb, { claimLimiter: fast(), parallelism: 2, signal }),
      async () => (await count('SELECT count(*)::int AS n FROM machine_agent_started')) === 0,
    );
    expect(await provider.readPowerState('dummy-000000')).toBe('On');
    expect([...provider.powerCycles.keys()]).toEqual(['dummy-000001']);
  });
});
