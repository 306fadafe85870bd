import { beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { HOSTILE_CAUSE, type SeededFleet, seedFleet } from '../../../test/support/fleet.js';
import { MACHINE_STAGES, type MachineStage, Queries } from '../src/index.js';

let fleet: SeededFleet;
let q: Queries;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  fleet = await seedFleet(db, bmdb);
  q = new Queries(bmdb.db);
});

test('fleetStages counts what fleetStats counts, one machine per stage', async () => {
  const fast = await q.fleetStages();
  const full = await q.fleetStats();
  expect(fast).toEqual({
    machines: full.machines,
    stages: full.stages,
    held: full.held,
    powerStates: full.powerStates,
    powerReadFailed: full.powerReadFailed,
  });
  expect(fast.stages).toEqual({
    unprovided: 1,
    provided: 2,
    agentStarting: 1,
    agentStarted: 1,
    heartbeating: 1,
    awaitingRecovery: 1,
    installed: 1,
  });
});

test('machinePage filters by stage, each stage from its own rows', async () => {
  const expected: Record<MachineStage, string[]> = {
    unprovided: [fleet.unprovided],
    provided: [fleet.provided, fleet.backedOff],
    agentStarting: [fleet.agentStarting],
    agentStarted: [fleet.agentStarted],
    heartbeating: [fleet.heartbeating],
    awaitingRecovery: [fleet.awaitingRecovery],
    installed: [fleet.installed],
  };
  for (const stage of MACHINE_STAGES) {
    const page = await q.machinePage({ stage });
    expect(page.machines.map((m) => m.machineId).sort(), stage).toEqual(expected[stage].sort());
    expect(page.machines.every((m) => m.stage === stage)).toBe(true);
  }
});

test('machinePage filters by provider, live work, backoff and search, and pages by keyset', async () => {
  const ids = async (filter: Parameters<Queries['machinePage']>[0]) =>
    (await q.machinePage(filter)).machines.map((m) => m.machineId);
  expect(await ids({ provider: 'Equinix' })).toEqual([fleet.heartbeating]);
  expect(await ids({ liveWork: 'ShepherdAgentStart' })).toEqual([fleet.agentStarting]);
  expect(await ids({ inBackoff: true })).toEqual([fleet.backedOff]);
  expect(await ids({ inBackoff: 'ShepherdRecovery' })).toEqual([]);
  expect(await ids({ search: 'dummy-sil' })).toEqual([fleet.awaitingRecovery]);
  expect(await ids({ search: fleet.unprovided.slice(0, 6) })).toContain(fleet.unprovided);
  expect(await ids({ search: 'dummy_%' })).toEqual([]);
  expect(await ids({ provider: 'Dummy', stage: 'provided' })).toEqual([fleet.provided, fleet.backedOff].sort());

  const all = Object.values(fleet.all).sort();
  const seen: string[] = [];
  let after: string | undefined;
  do {
    const page = await q.machinePage({ limit: 3, ...(after === undefined ? {} : { after }) });
    seen.push(...page.machines.map((m) => m.machineId));
    after = page.next;
  } while (after !== undefined);
  expect(seen).toEqual(all);
});

test('a machine summary and detail carry tags, work, backoffs and history', async () => {
  const [summary] = (await q.machinePage({ search: 'dummy-backoff' })).machines;
  expect(summary).toMatchObject({ stage: 'provided', backoffs: ['ShepherdAgentStart'], backoffCause: HOSTILE_CAUSE });
  const detail = await q.machineDetail(fleet.backedOff);
  expect(detail?.backoffs.map((b) => [b.process, b.active])).toEqual([
    ['ShepherdAgentStart', true],
    ['ShepherdRecovery', false],
  ]);
  expect(detail?.history.map((h) => h.event)).toEqual(['Failed', 'Started', 'Failed', 'Started']);
  expect(detail?.historyTotal).toBe(4);
  const starting = await q.machineDetail(fleet.agentStarting);
  expect(starting?.liveWork).toMatchObject([
    { process: 'ShepherdAgentStart', sessionId: fleet.session.id, processor: 'shepherd-initializer' },
  ]);
  expect(await q.machineDetail('not-a-uuid')).toBeUndefined();
  expect(await q.findMachine('dummy-silent')).toBe(fleet.awaitingRecovery);
  expect(await q.findMachine(fleet.unprovided.toUpperCase())).toBe(fleet.unprovided);
  expect(await q.findMachine('dummy')).toBeUndefined();
});

test('overview reads: sessions, backoff causes, recent failures, providers', async () => {
  expect(await q.liveSessions()).toMatchObject([
    { sessionId: fleet.session.id, processor: 'shepherd-initializer', work: 1 },
  ]);
  expect(await q.backoffCauses()).toMatchObject([
    { process: 'ShepherdAgentStart', cause: HOSTILE_CAUSE, machines: 1, exampleMachineId: fleet.backedOff },
  ]);
  const failures = await q.recentFailures({ limit: 2 });
  expect(failures.map((f) => [f.machineId, f.providerId])).toEqual([
    [fleet.backedOff, 'dummy-backoff'],
    [fleet.backedOff, 'dummy-backoff'],
  ]);
  expect(await q.providers()).toEqual(['Dummy', 'Equinix']);
  expect(await q.liveWorkByProcess()).toEqual({ ShepherdAgentStart: 1 });
});

test('backoff causes group one failure on many machines, whatever machine IDs and addresses they name', async () => {
  const machines = [fleet.provided, fleet.heartbeating, fleet.agentStarted];
  const causes = machines.map((id, i) => `agent on machine ${id}: dial 10.0.${i}.7:22: connection refused`);
  for (const [i, id] of machines.entries()) {
    await db.admin(
      `INSERT INTO work_backoff (machine_id, process, until, cause) VALUES ($1, 'ShepherdRecovery', now() + make_interval(mins => $2), $3)`,
      [id, i + 1, causes[i]],
    );
  }
  const [first] = await q.backoffCauses();
  expect(first).toMatchObject({
    process: 'ShepherdRecovery',
    cause: 'agent on machine <id>: dial <address>: connection refused',
    machines: 3,
    exampleMachineId: fleet.agentStarted,
    exampleCause: causes[2],
  });
});

test('machine_unprovided follows machines and their Provided tags', async () => {
  const unprovided = async () =>
    (await db.admin('SELECT machine_id FROM machine_unprovided ORDER BY machine_id')).rows.map((r) => r.machine_id);
  expect(await unprovided()).toEqual([fleet.unprovided]);
  const fresh = await fleet.session.transact((q) => q.newMachine());
  expect(await unprovided()).toEqual([fleet.unprovided, fresh].sort());
  await fleet.session.transact((q) => q.addProvided(fresh, { provider: 'Later', providerId: 'later-1' }));
  expect(await unprovided()).toEqual([fleet.unprovided]);
  await db.admin('DELETE FROM machine_provided WHERE machine_id = $1', [fresh]);
  expect(await unprovided()).toEqual([fleet.unprovided, fresh].sort());
  await db.admin('DELETE FROM machines WHERE machine_id = $1', [fresh]);
  await db.admin('DELETE FROM machines WHERE machine_id = $1', [fleet.provided]);
  expect(await unprovided()).toEqual([fleet.unprovided]);
  expect((await q.fleetStages()).stages.unprovided).toBe(1);
});
