import {
  agentStartSelection,
  machinesForAgentStart,
  Process,
  SHEPHERD_PROCESSES,
  setAgentStarted,
  workHistory,
} from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB, waitForAdvisoryLockWaiter } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import { hasLiveWork, NothingToDoError, type Selection, SessionExpiredError, WorkConflictError } from '../src/index.js';

let holder: pg.Client;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
});
afterAll(() => holder.end());

const startSelection = (provider: string) => agentStartSelection(bmdb.db, { provider });

async function history(machineId: string): Promise<string[]> {
  return (await workHistory(bmdb.db, machineId)).map((h) => `${h.process}:${h.event}`);
}

describe('claims from a selection', () => {
  test('claim one machine in one statement, hand over the selected row, and stop at NothingToDoError', async () => {
    const session = await bmdb.startSession();
    const ids = await provideMachines(session, 3, 'Selected');
    const claimed: string[] = [];
    for (let i = 0; i < 3; i++) {
      const work = await session.work(Process.ShepherdAgentStart, startSelection('Selected'));
      expect(work.candidate).toMatchObject({ machineId: work.machineId, provider: 'Selected' });
      expect(work.candidate.providerId).toMatch(/^selected-/);
      claimed.push(work.machineId);
    }
    expect(claimed.sort()).toEqual([...ids].sort());
    await expect(session.work(Process.ShepherdAgentStart, startSelection('Selected'))).rejects.toBeInstanceOf(
      NothingToDoError,
    );
    for (const machineId of ids) expect(await history(machineId)).toEqual(['ShepherdAgentStart:Started']);
    await session.close();
  });

  test('parallel sessions claiming from one selection never take a machine twice', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 60, 'Contended');
    await setup.close();
    const sessions = await Promise.all(Array.from({ length: 12 }, () => bmdb.startSession()));
    const claimed: string[] = [];
    await Promise.all(
      sessions.map(async (session) => {
        for (;;) {
          try {
            const work = await session.work(Process.ShepherdAgentStart, startSelection('Contended'));
            claimed.push(work.machineId);
            await work.finish((q) => setAgentStarted(q, work.machineId, { publicKey: new Uint8Array(32) }));
          } catch (error) {
            if (error instanceof NothingToDoError) return;
            throw error;
          }
        }
      }),
    );
    expect(claimed.sort()).toEqual([...ids].sort());
    await Promise.all(sessions.map((s) => s.close()));
  });

  test('a machine locked by a claim in flight is skipped, not waited for', async () => {
    const session = await bmdb.startSession();
    const [locked, free] = (await provideMachines(session, 2, 'InFlight')) as [string, string];
    await holder.query('BEGIN');
    try {
      await holder.query('SELECT 1 FROM machines WHERE machine_id = $1 FOR NO KEY UPDATE', [locked]);
      const work = await session.work(Process.ShepherdAgentStart, startSelection('InFlight'));
      expect(work.machineId).toBe(free);
      // Only the locked machine is left: every candidate is taken, which is a conflict, not idleness.
      await expect(session.work(Process.ShepherdAgentStart, startSelection('InFlight'))).rejects.toBeInstanceOf(
        WorkConflictError,
      );
    } finally {
      await holder.query('ROLLBACK');
    }
    const work = await session.work(Process.ShepherdAgentStart, startSelection('InFlight'));
    expect(work.machineId).toBe(locked);
    await session.close();
  });

  test('a machine claimed by another process after the claim took its snapshot is skipped', async () => {
    const session = await bmdb.startSession();
    const other = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Raced')) as [string];
    // The selection waits on an advisory lock after the statement's snapshot is taken; meanwhile
    // another process claims the machine and commits, as a concurrent claim would.
    const gated: Selection<string> = {
      process: Process.ShepherdAgentStart,
      query: bmdb.db
        .selectFrom('machine_provided as mp')
        .select('mp.machine_id')
        .where('mp.provider', '=', 'Raced')
        .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
        .where(sql<boolean>`(SELECT true FROM pg_advisory_xact_lock_shared(4242))`),
      toCandidate: (row) => row.machine_id,
    };
    await holder.query('BEGIN');
    await holder.query('SELECT pg_advisory_xact_lock(4242)');
    const claiming = session.work(Process.ShepherdAgentStart, gated);
    await waitForAdvisoryLockWaiter(db);
    await holder.query('UPDATE machines SET claim_version = claim_version + 1 WHERE machine_id = $1', [machineId]);
    await holder.query(`INSERT INTO work VALUES ($1, $2, 'ShepherdRecovery')`, [machineId, other.id]);
    await holder.query('COMMIT');

    await expect(claiming).rejects.toBeInstanceOf(NothingToDoError);
    const { rows } = await db.admin('SELECT process FROM work WHERE machine_id = $1', [machineId]);
    expect(rows).toEqual([{ process: 'ShepherdRecovery' }]);
    await Promise.all([session.close(), other.close()]);
  });

  test('a retriever whose machine was claimed after its snapshot runs again (serialization failure)', async () => {
    const session = await bmdb.startSession();
    const other = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'RacedRetriever')) as [string];
    let runs = 0;
    const claiming = session.work(Process.ShepherdAgentStart, async (q) => {
      const candidates = await machinesForAgentStart(q, { provider: 'RacedRetriever', limit: 1 });
      if (++runs === 1) {
        // Another process claims it now, after this transaction's snapshot.
        await other.work(Process.ShepherdRecovery, async () => [machineId]);
      }
      return candidates;
    });
    await expect(claiming).rejects.toBeInstanceOf(NothingToDoError);
    expect(runs).toBe(2);
    const { rows } = await db.admin('SELECT process FROM work WHERE machine_id = $1', [machineId]);
    expect(rows).toEqual([{ process: 'ShepherdRecovery' }]);
    await Promise.all([session.close(), other.close()]);
  });

  test('a claim left by an expired session is taken over', async () => {
    const slow = await openTestBMDB(db, { sessionInterval: 60_000, componentName: 'selection-takeover' });
    const session = await slow.startSession();
    const [machineId] = (await provideMachines(session, 1, 'SelectedTakeover')) as [string];
    const { rows } = await db.admin(
      `INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
       VALUES ('crashed', 'test', 5, now() - interval '3 seconds') RETURNING session_id`,
    );
    await db.admin(`INSERT INTO work VALUES ($1, $2, 'ShepherdAgentStart')`, [machineId, rows[0].session_id]);
    const work = await session.work(
      Process.ShepherdAgentStart,
      agentStartSelection(slow.db, { provider: 'SelectedTakeover' }),
    );
    expect(work.machineId).toBe(machineId);
    expect(await history(machineId)).toEqual(['ShepherdAgentStart:Canceled', 'ShepherdAgentStart:Started']);
    await work.finish();
    await slow.close();
  });

  test('an expired session claims nothing', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'SelectedExpired')) as [string];
    await db.admin(`UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1`, [session.id]);
    await expect(session.work(Process.ShepherdAgentStart, startSelection('SelectedExpired'))).rejects.toBeInstanceOf(
      SessionExpiredError,
    );
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = $1', [machineId])).rowCount).toBe(0);
    await session.close();
  });
});
