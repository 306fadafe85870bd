import type { Database } from '@bmaas/bmdb-controlloop';
import type { Kysely } from 'kysely';
import { beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { HOSTILE_CAUSE, type SeededFleet, seedFleet } from '../../../test/support/fleet.js';
import {
  addProvided,
  backoffCauses,
  findMachine,
  fleetStages,
  fleetStats,
  liveSessions,
  liveWorkByProcess,
  MACHINE_STAGES,
  type MachineStage,
  machineDetail,
  machinePage,
  newMachine,
  providers,
  recentFailures,
} from '../src/index.js';

let fleet: SeededFleet;
let q: Kysely<Database>;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  fleet = await seedFleet(db, bmdb);
  q = bmdb.db;
});

test('fleetStages counts what fleetStats counts, one machine per stage', async () => {
  const fast = await fleetStages(q);
  const full = await fleetStats(q);
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
    const page = await machinePage(q, { stage });
    expect(page.machines.map((m) => m.machineId).sort(), stage).toEqual(expected[stage].sort());
    expect(page.machines.every((m) => m.stage === stage)).toBe(true);
  }
});

test('machinePage filters by provider, live work, backoff and search, and pages by keyset', async () => {
  const ids = async (filter: Parameters<typeof machinePage>[1]) =>
    (await machinePage(q, filter)).machines.map((m) => m.machineId);
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
    const page = await machinePage(q, { limit: 3, ...(after === undefined ? {} : { after }) });
    seen.push(...page.machines.map((m) => m.machineId));
    after = page.next;
  } while (after !== undefined);
  expect(seen).toEqual(all);
});

test('a machine summary and detail carry tags, work, backoffs and history', async () => {
  const [summary] = (await machinePage(q, { search: 'dummy-backoff' })).machines;
  expect(summary).toMatchObject({ stage: 'provided', backoffs: ['ShepherdAgentStart'], backoffCause: HOSTILE_CAUSE });
  const detail = await machineDetail(q, fleet.backedOff);
  expect(detail?.backoffs.map((b) => [b.process, b.active])).toEqual([
    ['ShepherdAgentStart', true],
    ['ShepherdRecovery', false],
  ]);
  expect(detail?.history.map((h) => h.event)).toEqual(['Failed', 'Started', 'Failed', 'Started']);
  expect(detail?.historyTotal).toBe(4);
  const starting = await machineDetail(q, fleet.agentStarting);
  expect(starting?.liveWork).toMatchObject([
    { process: 'ShepherdAgentStart', sessionId: fleet.session.id, processor: 'shepherd-initializer' },
  ]);
  expect(await machineDetail(q, 'not-a-uuid')).toBeUndefined();
  expect(await findMachine(q, 'dummy-silent')).toBe(fleet.awaitingRecovery);
  expect(await findMachine(q, fleet.unprovided.toUpperCase())).toBe(fleet.unprovided);
  expect(await findMachine(q, 'dummy')).toBeUndefined();
});

test('overview reads: sessions, backoff causes, recent failures, providers', async () => {
  expect(await liveSessions(q)).toMatchObject([
    { sessionId: fleet.session.id, processor: 'shepherd-initializer', work: 1 },
  ]);
  expect(await backoffCauses(q)).toMatchObject([
    { process: 'ShepherdAgentStart', cause: HOSTILE_CAUSE, machines: 1, exampleMachineId: fleet.backedOff },
  ]);
  const failures = await recentFailures(q, { limit: 2 });
  expect(failures.map((f) => [f.machineId, f.providerId])).toEqual([
    [fleet.backedOff, 'dummy-backoff'],
    [fleet.backedOff, 'dummy-backoff'],
  ]);
  expect(await providers(q)).toEqual(['Dummy', 'Equinix']);
  expect(await liveWorkByProcess(q)).toEqual({ ShepherdAgentStart: 1 });
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
  const [first] = await backoffCauses(q);
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
  const fresh = await fleet.session.transact((q) => newMachine(q));
  expect(await unprovided()).toEqual([fleet.unprovided, fresh].sort());
  await fleet.session.transact((q) => addProvided(q, fresh, { provider: 'Later', providerId: 'later-1' }));
  expect(await unprovided()).toEqual([fleet.unprovided]);
  await db.admin('DELETE FROM machine_provided WHERE machine_id = $1', [fresh]);
  expect(await unprovided()).toEqual([fleet.unprovided, fresh].sort());
  await db.admin('DELETE FROM machines WHERE machine_id = $1', [fresh]);
  await db.admin('DELETE FROM machines WHERE machine_id = $1', [fleet.provided]);
  expect(await unprovided()).toEqual([fleet.unprovided]);
  expect((await fleetStages(q)).stages.unprovided).toBe(1);
});
