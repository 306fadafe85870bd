import type { Database } from '@bmaas/bmdb-controlloop';
import {
  machinesForAgentStart,
  Process,
  setAgentHeartbeat,
  setAgentStarted,
  workBackoffs,
  workHistory,
} from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';
import { describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { agentStartCandidates, provideMachines } from '../../../test/support/machines.js';
import { BMDBError, NothingToDoError, WorkConflictError, WorkEndedError, WorkLostError } from '../src/index.js';

const { db, bmdb } = await testBMDB();

function history(machineId: string) {
  return workHistory(bmdb.db, machineId);
}

/** Pretend `seconds` passed for every running backoff. */
async function expireBackoffs(): Promise<void> {
  await db.admin("UPDATE work_backoff SET until = now() - interval '1 second'");
}

describe('claims', () => {
  test('the same (machine, process) cannot be claimed twice from any session; another process can; cancel frees it', async () => {
    const a = await bmdb.startSession();
    const b = await bmdb.startSession();
    const [machineId] = (await provideMachines(a, 1, 'Claims')) as [string];
    const byId = async () => [machineId];

    const work = await a.work(Process.ShepherdAgentStart, byId);
    await expect(a.work(Process.ShepherdAgentStart, byId)).rejects.toBeInstanceOf(WorkConflictError);
    const conflict = b.work(Process.ShepherdAgentStart, byId);
    await expect(conflict).rejects.toBeInstanceOf(WorkConflictError);
    await expect(conflict).rejects.toThrow(machineId);

    const other = await b.work(Process.ShepherdRecovery, byId);
    await other.cancel();

    await work.cancel();
    const again = await b.work(Process.ShepherdAgentStart, byId);
    expect(again.machineId).toBe(machineId);
    await again.cancel();
    expect((await history(machineId)).map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdAgentStart:Started',
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Canceled',
      'ShepherdAgentStart:Canceled',
      'ShepherdAgentStart:Started',
      'ShepherdAgentStart:Canceled',
    ]);
    await a.close();
    await b.close();
  });

  test('no candidates is NothingToDoError; a candidate that is not a machine ID is refused', async () => {
    const session = await bmdb.startSession();
    await expect(session.work('Nothing', async () => [])).rejects.toBeInstanceOf(NothingToDoError);
    await expect(session.work('Nothing', async () => ['not-a-uuid'])).rejects.toThrow(/"not-a-uuid", not a machine ID/);
    await expect(session.work('Nothing', async () => ['not-a-uuid'])).rejects.toBeInstanceOf(BMDBError);
    await session.close();
  });

  test('a claim left by an expired session is taken over, with a Canceled event for the old claim', async () => {
    // Its own connection with a long interval, so no collector tidies the dead session away first.
    const slow = await openTestBMDB(db, { sessionInterval: 60_000, componentName: 'takeover' });
    const session = await slow.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Takeover')) as [string];
    const { rows } = await db.admin(
      `INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
       VALUES ('crashed', 'test', 5, now() - interval '3 seconds') RETURNING session_id`,
    );
    const dead = rows[0].session_id as string;
    await db.admin(`INSERT INTO work (machine_id, session_id, process) VALUES ($1, $2, 'ShepherdAgentStart')`, [
      machineId,
      dead,
    ]);

    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    expect(work.machineId).toBe(machineId);
    const owner = await db.admin('SELECT session_id FROM work WHERE machine_id = $1', [machineId]);
    expect(owner.rows).toEqual([{ session_id: session.id }]);
    await work.finish();
    const events = await history(machineId);
    expect(events.map((e) => e.event)).toEqual(['Canceled', 'Started', 'Finished']);
    expect(events[0]?.failedCause).toBe(`session ${dead} expired holding this claim`);
    await slow.close();
  });

  test('3 parallel workers over 6 machines each get work with no conflict', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 6, 'Parallel');
    const retriever = (q: Kysely<Database>) => machinesForAgentStart(q, { provider: 'Parallel', limit: 1 });
    const workers = await Promise.all([1, 2, 3].map(() => bmdb.startSession()));

    const firstRound = await Promise.all(workers.map((w) => w.work(Process.ShepherdAgentStart, retriever)));
    expect(new Set(firstRound.map((w) => w.machineId)).size).toBe(3);
    const processed = firstRound.map((w) => w.machineId);
    await Promise.all(firstRound.map((w) => w.finish((q) => setAgentStarted(q, w.machineId, { publicKey: key() }))));

    await Promise.all(
      workers.map(async (w) => {
        for (;;) {
          let work: Awaited<ReturnType<typeof w.work>>;
          try {
            work = await w.work(Process.ShepherdAgentStart, retriever);
          } catch (error) {
            if (error instanceof NothingToDoError) return;
            throw error; // a WorkConflictError would fail the test
          }
          processed.push(work.machineId);
          await work.finish((q) => setAgentStarted(q, work.machineId, { publicKey: key() }));
        }
      }),
    );
    expect(processed.sort()).toEqual([...ids].sort());
    await Promise.all([setup, ...workers].map((s) => s.close()));
  });
});

describe('ending work', () => {
  test('agent start: candidates, finish sets AgentStarted, history is exactly Started then Finished', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1)) as [string];
    const candidates = await session.transact((q) => machinesForAgentStart(q, { provider: 'Test', limit: 10 }));
    expect(candidates.map((c) => c.machineId)).toContain(machineId);

    const work = await session.work(Process.ShepherdAgentStart, async (q) =>
      (await machinesForAgentStart(q, { provider: 'Test', limit: 10 })).filter((m) => m.machineId === machineId),
    );
    expect(work.candidate.providerId).toMatch(/^test-/);
    // While claimed, it is no candidate.
    const whileClaimed = await session.transact((q) => machinesForAgentStart(q, { provider: 'Test', limit: 10 }));
    expect(whileClaimed.map((c) => c.machineId)).not.toContain(machineId);

    const publicKey = key();
    await work.finish((q) => setAgentStarted(q, machineId, { publicKey }));
    expect(work.state).toBe('finished');

    const started = await db.admin('SELECT agent_public_key FROM machine_agent_started WHERE machine_id = $1', [
      machineId,
    ]);
    expect(new Uint8Array(started.rows[0].agent_public_key)).toEqual(publicKey);
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Finished']);
    const after = await session.transact((q) => machinesForAgentStart(q, { provider: 'Test', limit: 10 }));
    expect(after.map((c) => c.machineId)).not.toContain(machineId);
    await session.close();
  });

  test('finishing twice is an error; fail after finish is an error; cancel after finish is a no-op', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1)) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    await work.finish();
    await expect(work.finish()).rejects.toBeInstanceOf(WorkEndedError);
    await expect(work.finish()).rejects.toThrow(
      `work on machine ${machineId} for process ShepherdAgentStart was already finished`,
    );
    await expect(work.fail(undefined, 'late')).rejects.toBeInstanceOf(WorkEndedError);
    await work.cancel();
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Finished']);
    await session.close();
  });

  test('a throwing finish callback records nothing and leaves the work active', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1)) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    await expect(
      work.finish(async (q) => {
        await setAgentStarted(q, machineId, { publicKey: key() });
        throw new Error('tag refused');
      }),
    ).rejects.toThrow('tag refused');
    expect(work.state).toBe('active');
    const tags = await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId]);
    expect(tags.rowCount).toBe(0);
    await work.fail(undefined, 'could not tag');
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Failed']);
    await session.close();
  });

  test('work whose claim was lost cannot finish, and records nothing', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1)) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    // Another session took the claim over after ours looked dead.
    await db.admin('DELETE FROM work WHERE machine_id = $1', [machineId]);
    await expect(work.finish((q) => setAgentStarted(q, machineId, { publicKey: key() }))).rejects.toBeInstanceOf(
      WorkLostError,
    );
    expect(work.state).toBe('lost');
    expect((await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId])).rowCount).toBe(0);
    await work.cancel(); // no-op
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started']);
    await session.close();
  });
});

describe('backoff', () => {
  test('a failed machine is hidden during its backoff and reappears after it; intervals grow, and reset after finish', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Backoff')) as [string];
    const retriever = (q: Kysely<Database>) => machinesForAgentStart(q, { provider: 'Backoff', limit: 1 });
    const backoff = { initial: 60_000, maximum: 3_600_000, exponent: 2 };
    const candidates = () => session.transact(retriever);
    const backoffRow = async () =>
      (
        await db.admin(
          'SELECT cause, last_interval_seconds, until - now() AS left FROM work_backoff WHERE machine_id = $1',
          [machineId],
        )
      ).rows[0];

    const intervals: number[] = [];
    for (const cause of ['dial failed', 'timeout', 'bad answer']) {
      const work = await session.work(Process.ShepherdAgentStart, retriever);
      await work.fail(backoff, cause);
      const row = await backoffRow();
      expect(row.cause).toBe(cause);
      intervals.push(row.last_interval_seconds);
      expect(await candidates()).toEqual([]); // hidden while backing off
      await expect(session.work(Process.ShepherdAgentStart, retriever)).rejects.toBeInstanceOf(NothingToDoError);
      await expireBackoffs();
      expect((await candidates()).map((c) => c.machineId)).toEqual([machineId]); // back after it
    }
    expect(intervals).toEqual([60, 120, 240]);

    const work = await session.work(Process.ShepherdAgentStart, retriever);
    expect(work.previousBackoffSeconds).toBe(240);
    await work.finish();
    expect(await backoffRow()).toBeUndefined();

    // Finished work forgets the history: the next failure starts over.
    await db.admin('DELETE FROM machine_agent_started WHERE machine_id = $1', [machineId]);
    const next = await session.work(Process.ShepherdAgentStart, retriever);
    await next.fail(backoff, 'again');
    expect((await backoffRow()).last_interval_seconds).toBe(60);

    const backoffs = await session.transact((q) => workBackoffs(q, machineId));
    expect(backoffs).toMatchObject([
      { process: 'ShepherdAgentStart', cause: 'again', lastIntervalSeconds: 60, active: true },
    ]);
    await session.close();
  });

  test('a cause with quotes, backslashes and a placeholder is recorded exactly (releases inline their values)', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Quoted')) as [string];
    const cause = String.raw`dial 'x': \n "$1" ' ); DROP TABLE work; --`;
    const work = await session.work("Process 'quoted'", async () => [machineId]);
    await work.fail(undefined, cause);
    const { rows } = await db.admin('SELECT process, cause FROM work_backoff WHERE machine_id = $1', [machineId]);
    expect(rows).toEqual([{ process: "Process 'quoted'", cause }]);
    expect((await history(machineId)).map((h) => h.failedCause)).toEqual([null, cause]);
    const again = await session.work("Process 'quoted'", async () => [machineId]);
    await again.finish((q) => setAgentHeartbeat(q, machineId));
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Failed', 'Started', 'Finished']);
    await session.close();
  });

  test('a backoff of one process does not hide the machine from another', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'OtherProcess')) as [string];
    const work = await session.work('SomethingElse', async () => [machineId]);
    await work.fail({ initial: 3_600_000, maximum: 3_600_000, exponent: 1 }, 'elsewhere');
    const candidates = await session.transact((q) => machinesForAgentStart(q, { provider: 'OtherProcess', limit: 5 }));
    expect(candidates.map((c) => c.machineId)).toEqual([machineId]);
    await session.close();
  });
});

test('work by agentStartCandidates helper stays consistent with its provider', async () => {
  const session = await bmdb.startSession();
  await provideMachines(session, 1);
  const work = await session.work(Process.ShepherdAgentStart, agentStartCandidates);
  expect(work.candidate.provider).toBe('Test');
  await work.cancel();
  await session.close();
});

function key(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(32));
}

describe('finish with tags', () => {
  const claimOne = async (provider: string) => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, provider)) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    return { session, machineId, work };
  };
  const tagsOf = async (machineId: string) => {
    const started = await db.admin(
      'SELECT agent_started_at, agent_public_key, has_heartbeat FROM machine_agent_started WHERE machine_id = $1',
      [machineId],
    );
    const heartbeat = await db.admin(
      'SELECT agent_heartbeat_at, agent_heartbeat_at <= now() AS not_future FROM machine_agent_heartbeat WHERE machine_id = $1',
      [machineId],
    );
    return { started: started.rows[0], heartbeat: heartbeat.rows[0] };
  };
  const candidates = (provider: string) =>
    machinesForAgentStart(bmdb.db, { provider, limit: 5 }).then((ms) => ms.map((m) => m.machineId));

  test('set.agentStarted records the key (and the time given) with Finished; the machine is no longer a candidate', async () => {
    const { session, machineId, work } = await claimOne('TagStarted');
    const publicKey = key();
    const startedAt = new Date('2026-01-02T03:04:05.678Z');
    await work.finish({ set: { agentStarted: { publicKey, startedAt } } });
    expect(work.state).toBe('finished');
    const { started } = await tagsOf(machineId);
    expect(new Uint8Array(started.agent_public_key)).toEqual(publicKey);
    expect(started.agent_started_at).toEqual(startedAt);
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Finished']);
    expect(await candidates('TagStarted')).toEqual([]);
    await session.close();
  });

  test('set.agentHeartbeat never records a time later than the database clock; with agentStarted, the mirror agrees', async () => {
    const { session, machineId, work } = await claimOne('TagHeartbeat');
    await work.finish({
      set: { agentStarted: { publicKey: key() }, agentHeartbeat: { at: new Date(Date.now() + 3_600_000) } },
    });
    const { started, heartbeat } = await tagsOf(machineId);
    expect(heartbeat.not_future).toBe(true);
    expect(started.has_heartbeat).toBe(true);
    await session.close();
  });

  test('delete removes AgentStarted and AgentHeartbeat, and the machine is an agent-start candidate again', async () => {
    const { session, machineId, work } = await claimOne('TagDelete');
    await work.finish({ set: { agentStarted: { publicKey: key() }, agentHeartbeat: {} } });
    expect(await candidates('TagDelete')).toEqual([]);
    const recovery = await session.work(Process.ShepherdRecovery, async () => [machineId]);
    await recovery.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
    expect(await tagsOf(machineId)).toEqual({ started: undefined, heartbeat: undefined });
    expect(await candidates('TagDelete')).toEqual([machineId]);
    await session.close();
  });

  test('tags that make no sense are refused before anything is recorded; the work stays active', async () => {
    const { session, machineId, work } = await claimOne('TagRefused');
    await expect(
      work.finish({ set: { agentStarted: { publicKey: key() } }, delete: ['agentStarted'] }),
    ).rejects.toThrow('tag agentStarted is both set and deleted');
    await expect(work.finish({ delete: ['agentRunning' as 'agentStarted'] })).rejects.toBeInstanceOf(BMDBError);
    await expect(
      work.finish({ set: { agentStarted: { publicKey: 'not bytes' as unknown as Uint8Array } } }),
    ).rejects.toThrow('publicKey must be a Uint8Array');
    await expect(work.finish({ set: { agentHeartbeat: { at: new Date(Number.NaN) } } })).rejects.toThrow(
      'must be a valid Date',
    );
    expect(work.state).toBe('active');
    expect(await tagsOf(machineId)).toEqual({ started: undefined, heartbeat: undefined });
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started']);
    await work.finish({});
    expect((await history(machineId)).map((h) => h.event)).toEqual(['Started', 'Finished']);
    await session.close();
  });
});
