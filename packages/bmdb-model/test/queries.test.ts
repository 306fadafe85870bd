import type { Session } from '@bmaas/bmdb-controlloop';
import { beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import {
  activeBackoffs,
  addProvided,
  agentHeartbeatsAhead,
  decommissionMachines,
  deleteAgentHeartbeat,
  deleteAgentStarted,
  fleetStats,
  machinesForAgentRecovery,
  machinesForAgentStart,
  machinesPerProvider,
  newMachine,
  Process,
  ProviderStatus,
  providedMachine,
  providedMachines,
  setAgentHeartbeat,
  setAgentHeartbeats,
  setAgentStarted,
  startedAgents,
  updateProviderStatus,
  workHistory,
} from '../src/index.js';

let session: Session;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  session = await bmdb.startSession();
});

const key = () => crypto.getRandomValues(new Uint8Array(32));

/** Moves an agent's start and last heartbeat into the past, in minutes (undefined: no heartbeat). */
async function ageAgent(machineId: string, startedMinutesAgo: number, heartbeatMinutesAgo: number | undefined) {
  await db.admin(
    `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
     VALUES ($1, now() - make_interval(mins => $2), '\\x00')`,
    [machineId, startedMinutesAgo],
  );
  if (heartbeatMinutesAgo !== undefined) {
    await db.admin(
      `INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES ($1, now() - make_interval(mins => $2))`,
      [machineId, heartbeatMinutesAgo],
    );
  }
}

describe('agent start candidates', () => {
  test('are provided machines of the provider without AgentStarted, live shepherd work or running backoff', async () => {
    const [fresh, started, claimed, claimedByDead, backedOff, recovering] = await provideMachines(session, 6, 'Start');
    const [otherProvider] = await provideMachines(session, 1, 'Elsewhere');
    const unprovided = await session.transact((q) => newMachine(q));
    await session.transact((q) => setAgentStarted(q, started as string, { publicKey: key() }));
    await session.work(Process.ShepherdAgentStart, async () => [claimed as string]);
    await session.work(Process.ShepherdRecovery, async () => [recovering as string]);
    const { rows } = await db.admin(
      `INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
       VALUES ('dead', 'test', 5, now() - interval '1 minute') RETURNING session_id`,
    );
    await db.admin(`INSERT INTO work VALUES ($1, $2, 'ShepherdAgentStart')`, [claimedByDead, rows[0].session_id]);
    await db.admin(
      `INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() + interval '5 minutes', 'dial failed', 300)`,
      [backedOff],
    );

    const candidates = await session.transact((q) => machinesForAgentStart(q, { provider: 'Start', limit: 100 }));
    // Work held by an expired session does not hide a machine.
    expect(candidates.map((c) => c.machineId).sort()).toEqual([fresh, claimedByDead].sort());
    expect(candidates.map((c) => c.machineId)).not.toContain(otherProvider);
    expect(candidates.map((c) => c.machineId)).not.toContain(unprovided);
    expect(await session.transact((q) => machinesForAgentStart(q, { provider: 'Start', limit: 1 }))).toHaveLength(1);
  });
});

describe('agent recovery candidates', () => {
  // started now / 40 min ago × heartbeat none / now / 20 min ago
  const matrix: [started: number, heartbeat: number | undefined, candidate: boolean][] = [
    [0, undefined, false],
    [0, 0, false],
    [0, 20, true],
    [40, undefined, true],
    [40, 0, false],
    [40, 20, true],
  ];

  test.each(matrix)(
    'agent started %d min ago, heartbeat %s min ago → candidate: %s',
    async (started, heartbeat, expected) => {
      const provider = `Recovery-${started}-${heartbeat ?? 'none'}`;
      const [machineId] = (await provideMachines(session, 1, provider)) as [string];
      await ageAgent(machineId, started, heartbeat);
      const candidates = await session.transact((q) => machinesForAgentRecovery(q, { provider, limit: 10 }));
      expect(candidates.map((c) => c.machineId)).toEqual(expected ? [machineId] : []);
    },
  );

  test('thresholds are configurable', async () => {
    const [machineId] = (await provideMachines(session, 1, 'RecoveryThresholds')) as [string];
    await ageAgent(machineId, 40, undefined);
    const lenient = await session.transact((q) =>
      machinesForAgentRecovery(q, { provider: 'RecoveryThresholds', limit: 10, firstHeartbeatWithin: 60 * 60_000 }),
    );
    expect(lenient).toEqual([]);
    await session.transact((q) => setAgentHeartbeat(q, machineId));
    await db.admin(
      "UPDATE machine_agent_heartbeat SET agent_heartbeat_at = now() - interval '3 minutes' WHERE machine_id = $1",
      [machineId],
    );
    const strict = await session.transact((q) =>
      machinesForAgentRecovery(q, { provider: 'RecoveryThresholds', limit: 10, heartbeatWithin: 2 * 60_000 }),
    );
    expect(strict.map((c) => c.machineId)).toEqual([machineId]);
  });

  test('exclude machines under live shepherd work or a running recovery backoff', async () => {
    const [claimed, backedOff] = (await provideMachines(session, 2, 'RecoveryBlocked')) as [string, string];
    await ageAgent(claimed, 40, undefined);
    await ageAgent(backedOff, 40, undefined);
    await session.work(Process.ShepherdAccess, async () => [claimed]);
    await db.admin(
      `INSERT INTO work_backoff VALUES ($1, 'ShepherdRecovery', now() + interval '1 minute', 'reboot failed', 60)`,
      [backedOff],
    );
    expect(
      await session.transact((q) => machinesForAgentRecovery(q, { provider: 'RecoveryBlocked', limit: 10 })),
    ).toEqual([]);
  });
});

describe('machine model', () => {
  test('provided machines, provider status updates and tag removal', async () => {
    const machineId = await session.transact(async (q) => {
      const id = await newMachine(q);
      await addProvided(q, id, { provider: 'Model', providerId: 'b-2', providerStatus: ProviderStatus.Provisioning });
      return id;
    });
    const second = await session.transact(async (q) => {
      const id = await newMachine(q);
      await addProvided(q, id, { provider: 'Model', providerId: 'a-1' });
      return id;
    });
    const updated = await session.transact((q) =>
      updateProviderStatus(q, 'Model', 'b-2', {
        providerStatus: ProviderStatus.Running,
        providerIpAddress: '192.0.2.10',
        providerLocation: 'am6',
      }),
    );
    expect(updated).toBe(true);
    expect(
      await session.transact((q) => updateProviderStatus(q, 'Model', 'missing', { providerStatus: 'Running' })),
    ).toBe(false);
    const machines = await session.transact((q) => providedMachines(q, 'Model'));
    expect(machines).toEqual([
      expect.objectContaining({ machineId: second, providerId: 'a-1', providerStatus: null }),
      {
        machineId,
        provider: 'Model',
        providerId: 'b-2',
        providerReservationId: null,
        providerIpAddress: '192.0.2.10',
        providerLocation: 'am6',
        providerStatus: 'Running',
      },
    ]);
    // A field left out keeps its value.
    await session.transact((q) => updateProviderStatus(q, 'Model', 'b-2', { providerReservationId: 'r-1' }));
    expect(await session.transact((q) => providedMachine(q, machineId))).toMatchObject({
      providerReservationId: 'r-1',
      providerIpAddress: '192.0.2.10',
    });

    // One provider ID belongs to one machine.
    await expect(
      session.transact(async (q) => addProvided(q, await newMachine(q), { provider: 'Model', providerId: 'a-1' })),
    ).rejects.toThrow(/machine_provided_provider_id_key/);
    // The status is checked by the database too.
    await expect(
      db.admin("UPDATE machine_provided SET provider_status = 'Exploded' WHERE machine_id = $1", [machineId]),
    ).rejects.toThrow(/check constraint/);

    await session.transact(async (q) => {
      await setAgentStarted(q, machineId, { publicKey: key() });
      await setAgentHeartbeat(q, machineId);
      await deleteAgentStarted(q, machineId);
      await deleteAgentHeartbeat(q, machineId);
    });
    const tags = await db.admin(
      `SELECT (SELECT count(*) FROM machine_agent_started WHERE machine_id = $1)::int
            + (SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1)::int AS n`,
      [machineId],
    );
    expect(tags.rows[0].n).toBe(0);
  });

  test('a heartbeat stamped in the future is recorded no later than the database clock', async () => {
    const [machineId] = (await provideMachines(session, 1, 'FastClock')) as [string];
    await session.transact((q) => setAgentHeartbeat(q, machineId, new Date(Date.now() + 365 * 86_400_000)));
    const { rows } = await db.admin(
      'SELECT agent_heartbeat_at <= now() AS sane FROM machine_agent_heartbeat WHERE machine_id = $1',
      [machineId],
    );
    expect(rows[0]?.sane).toBe(true);
    // A time in the past is kept as given.
    const past = new Date(Date.now() - 3_600_000);
    await session.transact((q) => setAgentHeartbeat(q, machineId, past));
    const kept = await db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [
      machineId,
    ]);
    expect(kept.rows[0].agent_heartbeat_at.getTime()).toBe(past.getTime());
  });

  test('fleet stats count each machine in exactly one lifecycle stage', async () => {
    const provider = 'Fleet';
    const [provided, starting, started, heartbeating, silent, stale] = (await provideMachines(
      session,
      6,
      provider,
    )) as string[];
    await session.work(Process.ShepherdAgentStart, async () => [starting as string]);
    await ageAgent(started as string, 5, undefined);
    await ageAgent(heartbeating as string, 60, 1);
    await ageAgent(silent as string, 45, undefined);
    await ageAgent(stale as string, 60, 15);
    const failed = await session.work(Process.ShepherdRecovery, async () => [stale as string]);
    await failed.fail({ initial: 60_000, maximum: 60_000, exponent: 1 }, 'reboot failed');
    expect(provided).toBeDefined();

    const stats = await fleetStats(bmdb.db, { provider });
    expect(stats.machines).toBe(6);
    expect(stats.stages).toEqual({
      unprovided: 0,
      provided: 1,
      agentStarting: 1,
      agentStarted: 1,
      heartbeating: 1,
      awaitingRecovery: 2,
      installed: 0,
    });
    expect(stats.activeWork.ShepherdAgentStart).toBeGreaterThanOrEqual(1);
    expect(stats.activeBackoffs.ShepherdRecovery).toBeGreaterThanOrEqual(1);
    const backoffs = await activeBackoffs(bmdb.db, { process: Process.ShepherdRecovery });
    expect(backoffs.find((b) => b.machineId === stale)).toMatchObject({ cause: 'reboot failed', active: true });
  });
});

describe('decommissioning', () => {
  test('removes free machines with their tags and backoffs, refuses busy ones, names unknown IDs; history stays', async () => {
    const [free, busy, deadWork, other] = await provideMachines(session, 4, 'Decommission');
    const ids = new Map<string, string>();
    for (const row of (
      await db.admin("SELECT machine_id, provider_id FROM machine_provided WHERE provider = 'Decommission'")
    ).rows as { machine_id: string; provider_id: string }[]) {
      ids.set(row.machine_id, row.provider_id);
    }
    const pid = (machineId: string | undefined) => ids.get(machineId as string) as string;
    await session.transact((q) => setAgentStarted(q, free as string, { publicKey: key() }));
    await db.admin(
      `INSERT INTO work_backoff VALUES ($1, 'ShepherdAgentStart', now() + interval '5 minutes', 'x', 300)`,
      [free],
    );
    // A finished piece of work leaves history behind.
    const done = await session.work(Process.ShepherdRecovery, async () => [free as string]);
    await done.finish();
    const held = await session.work(Process.ShepherdAgentStart, async () => [busy as string]);
    const { rows } = await db.admin(
      `INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
       VALUES ('dead', 'test', 5, now() - interval '1 minute') RETURNING session_id`,
    );
    await db.admin(`INSERT INTO work VALUES ($1, $2, 'ShepherdRecovery')`, [deadWork, rows[0].session_id]);

    const report = await session.transact((q) =>
      decommissionMachines(q, 'Decommission', [pid(free), pid(busy), pid(deadWork), 'no-such-machine', pid(free)]),
    );
    expect(report.removed.map((r) => r.machineId).sort()).toEqual([free, deadWork].sort());
    expect(report.removed.find((r) => r.machineId === free)?.providerId).toBe(pid(free));
    expect(report.busy).toEqual([{ providerId: pid(busy), machineId: busy, processes: ['ShepherdAgentStart'] }]);
    expect(report.unknown).toEqual(['no-such-machine']);

    const left = await session.transact((q) => providedMachines(q, 'Decommission'));
    expect(left.map((m) => m.machineId).sort()).toEqual([busy, other].sort());
    for (const table of ['machines', 'machine_agent_started', 'work_backoff', 'work', 'machine_agent_pending']) {
      const { rows } = await db.admin(`SELECT count(*)::int AS n FROM ${table} WHERE machine_id = ANY($1)`, [
        [free, deadWork],
      ]);
      expect({ table, n: rows[0].n }).toEqual({ table, n: 0 });
    }
    const history = await session.transact((q) => workHistory(q, free as string));
    expect(history.map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Finished',
    ]);

    // Once its work ended, the busy machine goes too; another provider's IDs are unknown to this one.
    await held.finish();
    const second = await session.transact((q) => decommissionMachines(q, 'Decommission', [pid(busy)]));
    expect(second.removed).toEqual([{ providerId: pid(busy), machineId: busy }]);
    expect((await session.transact((q) => decommissionMachines(q, 'Elsewhere', [pid(other)]))).unknown).toEqual([
      pid(other),
    ]);
    expect(await session.transact((q) => decommissionMachines(q, 'Decommission', []))).toEqual({
      removed: [],
      busy: [],
      unknown: [],
    });
  });
});

describe('reports for other packages', () => {
  test('machinesPerProvider counts each provider’s machines', async () => {
    await provideMachines(session, 3, 'CountedA');
    await provideMachines(session, 1, 'CountedB');
    const counts = await session.transact((q) => machinesPerProvider(q));
    expect(counts).toMatchObject({ CountedA: 3, CountedB: 1 });
    expect(counts.Nobody).toBeUndefined();
  });

  test('startedAgents and setAgentHeartbeats: started agents of one provider, heartbeats for many at once', async () => {
    const [started, notStarted] = (await provideMachines(session, 2, 'Beating')) as [string, string];
    const [elsewhere] = (await provideMachines(session, 1, 'BeatingElsewhere')) as [string];
    await session.transact(async (q) => {
      await setAgentStarted(q, started, { publicKey: key() });
      await setAgentStarted(q, elsewhere, { publicKey: key() });
    });
    const agents = await session.transact((q) => startedAgents(q, 'Beating'));
    expect(agents.map((a) => a.machineId)).toEqual([started]);
    expect(agents[0]?.startedAt).toBeInstanceOf(Date);

    await session.transact((q) => setAgentHeartbeats(q, [started, notStarted]));
    await session.transact((q) => setAgentHeartbeats(q, [started])); // an existing heartbeat is moved, not duplicated
    const { rows } = await db.admin(
      'SELECT machine_id FROM machine_agent_heartbeat WHERE machine_id = ANY($1) ORDER BY machine_id',
      [[started, notStarted, elsewhere]],
    );
    expect(rows.map((r: { machine_id: string }) => r.machine_id)).toEqual([started, notStarted].sort());
  });

  test('agentHeartbeatsAhead finds only the provider’s heartbeats beyond the tolerance, by the database clock', async () => {
    const [ahead, jitter] = (await provideMachines(session, 2, 'Ahead')) as [string, string];
    const [otherAhead] = (await provideMachines(session, 1, 'AheadElsewhere')) as [string];
    for (const [machineId, minutes] of [
      [ahead, 10],
      [jitter, 0.5],
      [otherAhead, 10],
    ] as const) {
      await db.admin(
        `INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at) VALUES ($1, now() + make_interval(secs => $2))`,
        [machineId, minutes * 60],
      );
    }
    const { now, heartbeats } = await agentHeartbeatsAhead(bmdb.db, {
      provider: 'Ahead',
      toleranceSeconds: 60,
    });
    expect(heartbeats.map((h) => h.machineId)).toEqual([ahead]);
    expect(heartbeats[0]?.providerId).toMatch(/^ahead-/);
    expect((heartbeats[0]?.heartbeatAt.getTime() ?? 0) - now.getTime()).toBeGreaterThan(9 * 60_000);
  });

  test('activeBackoffs gives each backoff its provider ID and whole seconds left', async () => {
    const [machineId] = (await provideMachines(session, 1, 'BackoffReport')) as [string];
    await db.admin(
      `INSERT INTO work_backoff VALUES ($1, 'ReportProcess', now() + interval '90.5 seconds', 'no route', 90)`,
      [machineId],
    );
    const [backoff] = await activeBackoffs(bmdb.db, { process: 'ReportProcess' });
    expect(backoff).toMatchObject({ machineId, provider: 'BackoffReport', cause: 'no route', active: true });
    expect(backoff?.providerId).toMatch(/^backoffreport-/);
    expect(backoff?.secondsLeft).toBeGreaterThanOrEqual(89);
    expect(backoff?.secondsLeft).toBeLessThanOrEqual(91);
  });
});
