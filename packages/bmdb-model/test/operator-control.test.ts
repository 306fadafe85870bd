import { BMDBError, isHeld, NothingToDoError, readyFor, type Session, selectionFor } from '@bmaas/bmdb-controlloop';
import { sql } from 'kysely';
import pg from 'pg';
import { beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import {
  agentRecoverySelection,
  agentStartSelection,
  decommissionMachines,
  fleetStages,
  fleetStats,
  forgetPowerRead,
  heldMachines,
  holdMachine,
  leasePowerRead,
  leasePowerReads,
  lookUpMachines,
  machineDetail,
  machineHold,
  machinePage,
  machinesForAgentRecovery,
  machinesForAgentStart,
  newMachine,
  operatorHistory,
  type PowerReadLease,
  Process,
  powerActionSelection,
  powerState,
  providedMachine,
  recordOperatorAction,
  recordPowerRead,
  recordPowerState,
  unholdMachine,
} from '../src/index.js';

let session: Session;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  session = await bmdb.startSession();
});

const q = () => bmdb.db;
const operator = { actor: 'alice@ops1' };

describe('holds', () => {
  test('a hold is a fact of the machine and an event of its history, as is the unhold', async () => {
    const [machineId] = (await provideMachines(session, 1, 'Held')) as [string];
    const { hold, placed } = await session.transact((q) =>
      holdMachine(q, machineId, { reason: 'disk swap', ...operator }),
    );
    expect(placed).toBe(true);
    expect(hold).toMatchObject({ machineId, reason: 'disk swap', actor: 'alice@ops1' });
    expect(await machineHold(q(), machineId)).toEqual(hold);

    // Held again: the first hold stays as it was, and nothing is recorded.
    const again = await session.transact((q) => holdMachine(q, machineId, { reason: 'other', actor: 'bob@ops2' }));
    expect(again).toEqual({ hold, placed: false, liveWork: [], installing: undefined });

    const released = await session.transact((q) => unholdMachine(q, machineId, { actor: 'bob@ops2' }));
    expect(released).toEqual(hold);
    expect(await machineHold(q(), machineId)).toBeUndefined();
    expect(await session.transact((q) => unholdMachine(q, machineId, { actor: 'bob@ops2' }))).toBeUndefined();

    const history = await operatorHistory(q(), machineId);
    expect(history.map((h) => [h.action, h.outcome, h.reason, h.actor])).toEqual([
      ['Hold', 'Succeeded', 'disk swap', 'alice@ops1'],
      ['Unhold', 'Succeeded', null, 'bob@ops2'],
    ]);
    expect(history[1]?.detail).toEqual({
      heldBy: 'alice@ops1',
      heldSince: hold.since.toISOString(),
      heldFor: 'disk swap',
    });
  });

  test('a hold needs a reason and an actor; nothing is written without them', async () => {
    const [machineId] = (await provideMachines(session, 1, 'HeldBadly')) as [string];
    await expect(session.transact((q) => holdMachine(q, machineId, { reason: ' ', ...operator }))).rejects.toThrow(
      new BMDBError(`hold of machine ${machineId}: a reason is needed (what is being done to the machine)`),
    );
    await expect(session.transact((q) => holdMachine(q, machineId, { reason: 'x', actor: '' }))).rejects.toThrow(
      /the actor must be named/,
    );
    expect(await machineHold(q(), machineId)).toBeUndefined();
    expect(await operatorHistory(q(), machineId)).toEqual([]);
  });

  test('held machines are listed longest held first, with provider ID and age', async () => {
    const [first, second] = (await provideMachines(session, 2, 'HeldList')) as [string, string];
    await session.transact((q) => holdMachine(q, second, { reason: 'later', ...operator }));
    await session.transact((q) => holdMachine(q, first, { reason: 'earlier', ...operator }));
    await db.admin(`UPDATE machine_hold SET held_at = now() - interval '2 hours' WHERE machine_id = $1`, [first]);
    const held = (await heldMachines(q())).filter((h) => h.provider === 'HeldList');
    expect(held.map((h) => [h.machineId, h.reason])).toEqual([
      [first, 'earlier'],
      [second, 'later'],
    ]);
    expect(held[0]?.ageSeconds).toBeGreaterThanOrEqual(7200);
    expect(held[0]?.providerId).toMatch(/^heldlist-/);
  });

  test('the shepherd’s selections leave held machines out; unholding puts them back', async () => {
    const [start, recover] = (await provideMachines(session, 2, 'HeldLoops')) as [string, string];
    await db.admin(
      `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
       VALUES ($1, now() - interval '2 hours', '\\x00')`,
      [recover],
    );
    const starts = () => machinesForAgentStart(q(), { provider: 'HeldLoops', limit: 10 });
    const recoveries = () => machinesForAgentRecovery(q(), { provider: 'HeldLoops', limit: 10 });
    expect((await starts()).map((m) => m.machineId)).toEqual([start]);
    expect((await recoveries()).map((m) => m.machineId)).toEqual([recover]);

    for (const machineId of [start, recover]) {
      await session.transact((q) => holdMachine(q, machineId, { reason: 'rack work', ...operator }));
    }
    expect(await starts()).toEqual([]);
    expect(await recoveries()).toEqual([]);
    await expect(
      session.work(Process.ShepherdAgentStart, agentStartSelection(q(), { provider: 'HeldLoops' })),
    ).rejects.toBeInstanceOf(NothingToDoError);
    await expect(
      session.work(Process.ShepherdRecovery, agentRecoverySelection(q(), { provider: 'HeldLoops' })),
    ).rejects.toBeInstanceOf(NothingToDoError);

    for (const machineId of [start, recover]) {
      await session.transact((q) => unholdMachine(q, machineId, operator));
    }
    const work = await session.work(Process.ShepherdRecovery, agentRecoverySelection(q(), { provider: 'HeldLoops' }));
    expect(work.machineId).toBe(recover);
    await work.cancel();
  });

  test('selectionFor leaves held machines out unless the selection opts in; readyFor and isHeld say the same', async () => {
    const [free, held] = (await provideMachines(session, 2, 'HeldOwn')) as [string, string];
    await session.transact((q) => holdMachine(q, held, { reason: 'firmware update', ...operator }));
    const source = {
      query: bmdb.db.selectFrom('machine_provided').select('machine_id').where('provider', '=', 'HeldOwn'),
      toCandidate: (row: { machine_id: string }) => row.machine_id,
    };
    const candidates = async (process: string, includeHeld?: boolean) => {
      const selection = selectionFor(process, { ...source, ...(includeHeld === undefined ? {} : { includeHeld }) });
      const { rows } = await sql<{ machine_id: string }>`${selection.query}`.execute(bmdb.db);
      return rows.map((row) => row.machine_id).sort();
    };
    expect(await candidates('OwnLoop')).toEqual([free]);
    expect(await candidates('OwnLoop', false)).toEqual([free]);
    expect(await candidates('OwnLoop', true)).toEqual([free, held].sort());

    const hand = async (condition: ReturnType<typeof readyFor>) =>
      (
        await bmdb.db
          .selectFrom('machine_provided as mp')
          .select('mp.machine_id')
          .where('mp.provider', '=', 'HeldOwn')
          .where(condition)
          .execute()
      )
        .map((row) => row.machine_id)
        .sort();
    expect(await hand(readyFor('mp.machine_id', 'OwnLoop'))).toEqual([free]);
    expect(await hand(readyFor('mp.machine_id', 'OwnLoop', [], { includeHeld: true }))).toEqual([free, held].sort());
    expect(await hand(isHeld('mp.machine_id'))).toEqual([held]);

    // Claiming with an opted-in selection takes the held machine too.
    const work = await session.work(
      'OwnLoop',
      selectionFor('OwnLoop', {
        query: bmdb.db.selectFrom('machine_provided').select('machine_id').where('machine_id', '=', held),
        toCandidate: (row) => row.machine_id,
        includeHeld: true,
      }),
    );
    expect(work.machineId).toBe(held);
    await work.finish();
  });

  test('unholding a machine wakes idle loops (bmdb_machines_changed)', async () => {
    const [machineId] = (await provideMachines(session, 1, 'HeldWake')) as [string];
    await session.transact((q) => holdMachine(q, machineId, { reason: 'wake test', ...operator }));
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    try {
      const notified = new Promise<string>((resolve) => listener.on('notification', (n) => resolve(n.payload ?? '')));
      await listener.query('LISTEN bmdb_machines_changed');
      await session.transact((q) => unholdMachine(q, machineId, operator));
      expect(await notified).toBe('machine_hold');
    } finally {
      await listener.end();
    }
  });
});

describe('looking machines up', () => {
  test('by provider IDs or machine IDs, in the order asked, with their live work; unknown names apart', async () => {
    const [a, b] = (await provideMachines(session, 2, 'Lookup')) as [string, string];
    const unprovided = await session.transact((q) => newMachine(q));
    const work = await session.work(Process.ShepherdRecovery, async () => [b]);
    const ids = await Promise.all([a, b].map(async (id) => (await providedMachine(q(), id))?.providerId as string));
    const byProvider = await lookUpMachines(q(), {
      provider: 'Lookup',
      providerIds: [ids[1] as string, 'nope', ids[0] as string],
    });
    expect(byProvider).toEqual({
      found: [
        { machineId: b, provider: 'Lookup', providerId: ids[1], liveWork: ['ShepherdRecovery'] },
        { machineId: a, provider: 'Lookup', providerId: ids[0], liveWork: [] },
      ],
      unknown: ['nope'],
    });
    // The same provider ID under another provider is unknown.
    expect((await lookUpMachines(q(), { provider: 'Other', providerIds: [ids[0] as string] })).unknown).toEqual([
      ids[0],
    ]);
    const missing = '00000000-0000-4000-8000-000000000000';
    const byMachine = await lookUpMachines(q(), { machineIds: [unprovided.toUpperCase(), missing, 'not-a-uuid'] });
    expect(byMachine).toEqual({
      found: [{ machineId: unprovided, provider: null, providerId: null, liveWork: [] }],
      unknown: [missing, 'not-a-uuid'],
    });
    await work.cancel();
  });
});

describe('power actions as claims', () => {
  test('a power action claims a held machine, and is refused while any shepherd process works on it', async () => {
    const [machineId] = (await provideMachines(session, 1, 'PowerClaim')) as [string];
    await session.transact((q) => holdMachine(q, machineId, { reason: 'held for power', ...operator }));
    const action = await session.work(Process.ShepherdPowerAction, powerActionSelection(q(), machineId));
    expect(action.candidate).toMatchObject({ machineId, provider: 'PowerClaim' });
    // A second action on it, and a recovery or agent start, are refused while it runs.
    await expect(
      session.work(Process.ShepherdPowerAction, powerActionSelection(q(), machineId)),
    ).rejects.toBeInstanceOf(NothingToDoError);
    await action.finish();

    const other = await bmdb.startSession();
    const recovery = await other.work(Process.ShepherdRecovery, async () => [machineId]);
    await expect(
      session.work(Process.ShepherdPowerAction, powerActionSelection(q(), machineId)),
    ).rejects.toBeInstanceOf(NothingToDoError);
    await recovery.finish();
    const again = await session.work(Process.ShepherdPowerAction, powerActionSelection(q(), machineId));
    await again.finish();
    await other.close();
  });

  test('under contention, a power action and a recovery of one machine never both hold it', async () => {
    const machines = await provideMachines(session, 30, 'PowerRace');
    for (const machineId of machines) {
      await db.admin(
        `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
         VALUES ($1, now() - interval '2 hours', '\\x00')`,
        [machineId],
      );
    }
    const recoverers = await Promise.all(Array.from({ length: 4 }, () => bmdb.startSession()));
    const operators = await Promise.all(Array.from({ length: 4 }, () => bmdb.startSession()));
    // Every claim holds its machine for a moment, asking the database as it starts and as it ends
    // whether work of the other process is live on it too. (History timestamps cannot tell: a
    // statement's now() is when it arrived, not when it took its snapshot.)
    const overlaps: string[] = [];
    const hold = async (machineId: string, process: string) => {
      for (let look = 0; look < 2; look++) {
        const { rows } = await db.admin(
          `SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
           WHERE w.machine_id = $1 AND w.process <> $2 AND s.deadline > now()`,
          [machineId, process],
        );
        for (const row of rows) overlaps.push(`${machineId}: ${process} while ${row.process}`);
        if (look === 0) await new Promise((resolve) => setTimeout(resolve, 1));
      }
    };
    let recovered = 0;
    let powered = 0;
    const recovering = recoverers.map(async (s) => {
      for (;;) {
        try {
          const work = await s.work(Process.ShepherdRecovery, agentRecoverySelection(q(), { provider: 'PowerRace' }));
          await hold(work.machineId, Process.ShepherdRecovery);
          recovered++;
          await work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
        } catch (error) {
          if (error instanceof NothingToDoError) return;
          throw error;
        }
      }
    });
    const acting = operators.map(async (s, i) => {
      for (let round = 0; round < 3; round++) {
        for (const machineId of machines.slice(i * 7, i * 7 + 8)) {
          try {
            const work = await s.work(Process.ShepherdPowerAction, powerActionSelection(q(), machineId));
            await hold(work.machineId, Process.ShepherdPowerAction);
            powered++;
            await work.finish();
          } catch (error) {
            if (!(error instanceof NothingToDoError)) throw error;
          }
        }
      }
    });
    await Promise.all([...recovering, ...acting]);
    expect(overlaps).toEqual([]);
    expect(recovered).toBe(30);
    expect(powered).toBeGreaterThan(0);
    await Promise.all([...recoverers, ...operators].map((s) => s.close()));
  });
});

describe('operator history', () => {
  test('records any action with outcome, reason, actor, cause and detail; refuses what makes no sense', async () => {
    const [machineId] = (await provideMachines(session, 1, 'History')) as [string];
    await session.transact(async (q) => {
      await recordOperatorAction(q, {
        machineId,
        action: 'PowerOff',
        outcome: 'Failed',
        reason: 'swap PSU',
        actor: 'carol@ops3',
        cause: 'BMC refused: HTTP 409',
        detail: { graceful: true },
      });
      await recordOperatorAction(q, { machineId, action: 'OsInstallationRequest', outcome: 'Succeeded', actor: 'x@y' });
    });
    await db.admin(`UPDATE operator_history SET "timestamp" = now() - interval '1 minute' WHERE action = 'PowerOff'`);
    const history = await operatorHistory(q(), machineId);
    expect(history).toMatchObject([
      {
        action: 'PowerOff',
        outcome: 'Failed',
        reason: 'swap PSU',
        actor: 'carol@ops3',
        cause: 'BMC refused: HTTP 409',
        detail: { graceful: true },
      },
      { action: 'OsInstallationRequest', outcome: 'Succeeded', reason: null, cause: null, detail: null },
    ]);
    expect((await operatorHistory(q(), machineId, { newestFirst: true, limit: 1 })).map((h) => h.action)).toEqual([
      'OsInstallationRequest',
    ]);
    await expect(
      recordOperatorAction(q(), { machineId, action: 'X', outcome: 'Maybe' as 'Failed', actor: 'a' }),
    ).rejects.toThrow(/outcome "Maybe" is none of Succeeded, Failed, Refused/);
    await expect(recordOperatorAction(q(), { machineId, action: '', outcome: 'Failed', actor: 'a' })).rejects.toThrow(
      /the action must be named/,
    );
  });

  test('stays after the machine is decommissioned', async () => {
    const [machineId] = (await provideMachines(session, 1, 'HistoryGone')) as [string];
    await session.transact((q) => holdMachine(q, machineId, { reason: 'retire', ...operator }));
    const providerId = (await providedMachine(q(), machineId))?.providerId as string;
    await session.transact((q) => decommissionMachines(q, 'HistoryGone', [providerId]));
    expect((await operatorHistory(q(), machineId)).map((h) => h.action)).toEqual(['Hold']);
  });
});

describe('power state', () => {
  test('every provided machine gets a row, kept under its provider; reads are leased never-read first', async () => {
    const ids = await provideMachines(session, 3, 'PowerSync');
    const rows = await db.admin(`SELECT provider FROM machine_power_state WHERE machine_id = ANY ($1::uuid[])`, [ids]);
    expect(rows.rows.map((r) => r.provider)).toEqual(['PowerSync', 'PowerSync', 'PowerSync']);
    expect(await powerState(q(), ids[0] as string)).toEqual({
      machineId: ids[0],
      state: null,
      readAt: null,
      failedAt: null,
      failedCause: null,
    });

    const lease = () => leasePowerReads(q(), { provider: 'PowerSync', limit: 2, intervalSeconds: 60 });
    const first = await lease();
    const second = await lease();
    expect(first).toHaveLength(2);
    expect(second).toHaveLength(1);
    expect(new Set([...first, ...second].map((l) => l.machineId))).toEqual(new Set(ids));
    // Nothing is due again before the interval passes.
    expect(await lease()).toEqual([]);

    const [a, b] = first as [(typeof first)[0], (typeof first)[0]];
    expect(await recordPowerRead(q(), a, { state: 'Off' })).toMatchObject({ machineId: a.machineId, state: null });
    expect(await recordPowerRead(q(), b, { failure: 'BMC unreachable' })).toMatchObject({ failedCause: null });
    expect(await powerState(q(), a.machineId)).toMatchObject({ state: 'Off', failedAt: null, failedCause: null });
    expect((await powerState(q(), a.machineId))?.readAt).toBeInstanceOf(Date);
    expect(await powerState(q(), b.machineId)).toMatchObject({ state: null, failedCause: 'BMC unreachable' });
    // A failure keeps the last state read; a good read clears the failure.
    await db.admin(`UPDATE machine_power_state SET power_checked_at = now() - interval '2 minutes'`);
    const again = await lease();
    const aAgain = again.find((l) => l.machineId === a.machineId);
    expect(aAgain).toBeDefined();
    expect(await recordPowerRead(q(), aAgain as (typeof again)[0], { failure: 'timeout' })).toMatchObject({
      state: 'Off',
      failedCause: null,
    });
    expect(await powerState(q(), a.machineId)).toMatchObject({ state: 'Off', failedCause: 'timeout' });
    await recordPowerState(q(), a.machineId, { state: 'On' });
    expect(await powerState(q(), a.machineId)).toMatchObject({ state: 'On', failedAt: null, failedCause: null });

    // The oldest taken up comes first once due.
    await db.admin(
      `UPDATE machine_power_state SET power_checked_at = now() - make_interval(mins => 10 + array_position($1::uuid[], machine_id))
       WHERE machine_id = ANY ($1::uuid[])`,
      [ids],
    );
    expect(
      (await leasePowerReads(q(), { provider: 'PowerSync', limit: 3, intervalSeconds: 60 })).map((l) => l.machineId),
    ).toEqual([...ids].reverse());
  });

  test('a read taken up before a power action does not count once the action asked for a fresh one', async () => {
    const [machineId] = (await provideMachines(session, 1, 'PowerStale')) as [string];
    const [lease] = await leasePowerReads(q(), { provider: 'PowerStale', limit: 1, intervalSeconds: 60 });
    await forgetPowerRead(q(), machineId);
    expect(await recordPowerRead(q(), lease as NonNullable<typeof lease>, { state: 'On' })).toBeUndefined();
    expect((await powerState(q(), machineId))?.state).toBeNull();
    // Forgotten: it is the next read.
    expect(
      (await leasePowerReads(q(), { provider: 'PowerStale', limit: 1, intervalSeconds: 60 })).map((l) => l.machineId),
    ).toEqual([machineId]);
  });

  test('a read on demand never overwrites a state recorded after it began: a power action’s, or a later read’s', async () => {
    const [machineId] = (await provideMachines(session, 1, 'PowerOnDemand')) as [string];
    const sync = () => leasePowerReads(q(), { provider: 'PowerOnDemand', limit: 1, intervalSeconds: 60 });
    expect(await leasePowerRead(q(), machineId)).toMatchObject({ machineId, providerId: expect.any(String) });

    // A status read began, then a power off completed (it asks for a fresh read): the old state is not recorded.
    const slow = (await leasePowerRead(q(), machineId)) as PowerReadLease;
    await forgetPowerRead(q(), machineId);
    expect(await recordPowerRead(q(), slow, { state: 'On' })).toBeUndefined();
    expect(await powerState(q(), machineId)).toMatchObject({ state: null, readAt: null });
    // ... and the power sync still reads the machine next, not a whole interval later.
    const [fresh] = await sync();
    expect(fresh?.machineId).toBe(machineId);

    // A read on demand that began after the sync's: the sync's older read is not recorded over it.
    const status = (await leasePowerRead(q(), machineId)) as PowerReadLease;
    expect(await recordPowerRead(q(), status, { state: 'Off' })).toMatchObject({ state: null });
    expect(await recordPowerRead(q(), fresh as PowerReadLease, { state: 'On' })).toBeUndefined();
    expect(await powerState(q(), machineId)).toMatchObject({ state: 'Off' });
    // Nor is a read on demand that began before another one was recorded.
    const older = (await leasePowerRead(q(), machineId)) as PowerReadLease;
    const newer = (await leasePowerRead(q(), machineId)) as PowerReadLease;
    expect(await recordPowerRead(q(), newer, { failure: 'BMC timeout' })).toMatchObject({ state: 'Off' });
    expect(await recordPowerRead(q(), older, { state: 'On' })).toBeUndefined();
    expect(await powerState(q(), machineId)).toMatchObject({ state: 'Off', failedCause: 'BMC timeout' });
    // An unprovided machine has nothing to lease.
    expect(await leasePowerRead(q(), await session.transact((q) => newMachine(q)))).toBeUndefined();
  });

  test('concurrent syncs take up different machines', async () => {
    const ids = await provideMachines(session, 40, 'PowerShared');
    const leases = await Promise.all(
      Array.from({ length: 8 }, () => leasePowerReads(q(), { provider: 'PowerShared', limit: 5, intervalSeconds: 60 })),
    );
    const taken = leases.flat().map((l) => l.machineId);
    expect(new Set(taken).size).toBe(taken.length);
    expect(new Set(taken)).toEqual(new Set(ids));
    // Their records, concurrent too, each land (no serialization failure between them).
    const recorded = await Promise.all(leases.flat().map((lease) => recordPowerRead(q(), lease, { state: 'On' })));
    expect(recorded.every((before) => before !== undefined)).toBe(true);
    const { rows } = await db.admin(
      `SELECT count(*)::int AS n FROM machine_power_state WHERE provider = 'PowerShared' AND power_state = 'On'`,
    );
    expect(rows[0].n).toBe(40);
  });

  test('a bad state is refused naming the machine', async () => {
    const [machineId] = (await provideMachines(session, 1, 'PowerBad')) as [string];
    await expect(recordPowerState(q(), machineId, { state: 'Sleepy' as 'On' })).rejects.toThrow(
      `power state of machine ${machineId}: "Sleepy" is none of On, Off, PoweringOn, PoweringOff, Unknown`,
    );
  });
});

describe('the fleet page and status', () => {
  test('count held machines and machines per power state; filter by them; show them per machine', async () => {
    const fresh = await openTestBMDB(await createTestDatabase());
    const s = await fresh.startSession();
    const [on, off, unread, held] = (await provideMachines(s, 4, 'Page')) as [string, string, string, string];
    for (const [machineId, state] of [
      [on, 'On'],
      [off, 'Off'],
      [held, 'On'],
    ] as const) {
      await s.transact((q) => recordPowerState(q, machineId, { state }));
    }
    await s.transact((q) => recordPowerState(q, unread, { failure: 'no route to BMC' }));
    await s.transact((q) => holdMachine(q, held, { reason: 'memory test', ...operator }));
    const unprovided = await s.transact((q) => newMachine(q));
    const fq = fresh.db;

    const counts = { On: 2, Off: 1, PoweringOn: 0, PoweringOff: 0, Unknown: 0, Unread: 1 };
    expect(await fleetStages(fq)).toMatchObject({ machines: 5, held: 1, powerStates: counts, powerReadFailed: 1 });
    expect(await fleetStats(fq)).toMatchObject({ machines: 5, held: 1, powerStates: counts, powerReadFailed: 1 });
    expect(await fleetStats(fq, { provider: 'Elsewhere' })).toMatchObject({ held: 0, powerReadFailed: 0 });

    const page = async (filter: Parameters<typeof machinePage>[1]) =>
      (await machinePage(fq, filter)).machines.map((m) => m.machineId).sort();
    expect(await page({ held: true })).toEqual([held]);
    expect(await page({ held: false })).toEqual([on, off, unread, unprovided].sort());
    expect(await page({ powerState: 'On' })).toEqual([on, held].sort());
    expect(await page({ powerState: 'Unread' })).toEqual([unread]);
    expect(await page({ powerState: 'On', held: false })).toEqual([on]);
    expect(await page({ provider: 'Page', powerState: 'Off' })).toEqual([off]);

    const summary = (await machinePage(fq, { held: true })).machines[0];
    expect(summary).toMatchObject({ powerState: 'On', hold: { reason: 'memory test', actor: 'alice@ops1' } });
    expect(summary?.powerStateReadAt).toBeInstanceOf(Date);

    const detail = await machineDetail(fq, held);
    expect(detail?.power).toMatchObject({ state: 'On', failedAt: null });
    expect(detail?.operatorHistory.map((h) => h.action)).toEqual(['Hold']);
    expect((await machineDetail(fq, unread))?.power).toMatchObject({ state: null, failedCause: 'no route to BMC' });
    expect((await machineDetail(fq, unprovided))?.power).toBeNull();
    await s.close();
  });
});
