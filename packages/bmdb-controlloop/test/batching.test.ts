import { agentStartSelection, Process, SHEPHERD_PROCESSES, setAgentStarted, workHistory } from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB, waitForAdvisoryLockWaiter } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import {
  type BMDB,
  hasLiveWork,
  NothingToDoError,
  type Selection,
  type Session,
  SessionExpiredError,
  type Work,
  WorkLostError,
} from '../src/index.js';

let holder: pg.Client;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  holder = new pg.Client({ connectionString: db.url });
  await holder.connect();
});
afterAll(() => holder.end());

const startSelection = (provider: string, on: BMDB = bmdb) => agentStartSelection(on.db, { provider });
const sessions = (n: number, on: BMDB = bmdb) => Promise.all(Array.from({ length: n }, () => on.startSession()));
const closeAll = (all: readonly Session[]) => Promise.all(all.map((s) => s.close()));
const key = (byte: number) => new Uint8Array(32).fill(byte);

/** Distinct timestamps of `event` for these machines: one per statement that wrote them. */
async function statementsWriting(event: string, machineIds: readonly string[]): Promise<number> {
  const { rows } = await db.admin(
    `SELECT count(DISTINCT "timestamp")::int AS n FROM work_history WHERE event = $1 AND machine_id = ANY($2::uuid[])`,
    [event, machineIds],
  );
  return rows[0].n;
}

async function events(machineId: string): Promise<string[]> {
  return (await workHistory(bmdb.db, machineId)).map((h) => `${h.process}:${h.event}`);
}

/** Claims `machineId` for `process` in `session`, through a retriever. */
const claim = (session: Session, machineId: string, process: string = Process.ShepherdAgentStart) =>
  session.work(process, async () => [machineId]);

describe('claims made together', () => {
  test('go as one statement: one machine per session, each told its own result', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 5, 'Together');
    await setup.close();
    const claimers = await sessions(8);
    const results = await Promise.allSettled(
      claimers.map((s) => s.work(Process.ShepherdAgentStart, startSelection('Together'))),
    );
    const claimed = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.machineId] : []));
    expect(claimed.sort()).toEqual([...ids].sort());
    const refused = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
    expect(refused).toHaveLength(3);
    for (const reason of refused) expect(reason).toBeInstanceOf(NothingToDoError);
    // Each claim is its session's own.
    const owners = await db.admin('SELECT machine_id, session_id FROM work WHERE machine_id = ANY($1::uuid[])', [ids]);
    const holders = new Map(owners.rows.map((r) => [r.machine_id, r.session_id]));
    results.forEach((r, i) => {
      if (r.status === 'fulfilled') expect(holders.get(r.value.machineId)).toBe(claimers[i]?.id);
    });
    expect(await statementsWriting('Started', ids)).toBe(1);
    await closeAll(claimers);
  });

  test('serve the live sessions and refuse an expired one, which claims nothing', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 3, 'TogetherExpired');
    await setup.close();
    const [alive1, expired, alive2] = (await sessions(3)) as [Session, Session, Session];
    await db.admin(`UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1`, [expired.id]);
    const results = await Promise.allSettled(
      [alive1, expired, alive2].map((s) => s.work(Process.ShepherdAgentStart, startSelection('TogetherExpired'))),
    );
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(results[1]?.status === 'rejected' && results[1].reason).toBeInstanceOf(SessionExpiredError);
    const held = await db.admin('SELECT session_id FROM work WHERE machine_id = ANY($1::uuid[])', [ids]);
    expect(held.rows.map((r) => r.session_id).sort()).toEqual([alive1.id, alive2.id].sort());
    await closeAll([alive1, expired, alive2]);
  });

  test('from several connections at once never take a machine twice', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 90, 'ManyConnections');
    await setup.close();
    const others = [
      await openTestBMDB(db, { componentName: 'other-1' }),
      await openTestBMDB(db, { componentName: 'other-2' }),
    ];
    const all = (await Promise.all([bmdb, ...others].map((on) => sessions(6, on)))).flat();
    const claimed: string[] = [];
    await Promise.all(
      all.map(async (session, i) => {
        const on = [bmdb, ...others][Math.floor(i / 6)] as BMDB;
        const selection = startSelection('ManyConnections', on);
        for (;;) {
          let work: Work;
          try {
            work = await session.work(Process.ShepherdAgentStart, selection);
          } catch (error) {
            if (error instanceof NothingToDoError) return;
            throw error;
          }
          claimed.push(work.machineId);
          await work.finish({ set: { agentStarted: { publicKey: key(1) } } });
        }
      }),
    );
    expect(claimed.sort()).toEqual([...ids].sort());
    const { rows } = await db.admin(
      `SELECT count(*)::int AS n FROM work_history WHERE event = 'Started' AND machine_id = ANY($1::uuid[])`,
      [ids],
    );
    expect(rows[0].n).toBe(ids.length);
    await closeAll(all);
  });

  test('skip a machine claimed by another process after their snapshot; the request left over looks again', async () => {
    const setup = await bmdb.startSession();
    const [raced, free] = (await provideMachines(setup, 2, 'TogetherRaced')) as [string, string];
    await setup.close();
    const [a, b, other] = (await sessions(3)) as [Session, Session, Session];
    // The selection waits on an advisory lock after the statement's snapshot is taken; meanwhile
    // another process claims one machine and commits.
    const gated: Selection<string> = {
      process: Process.ShepherdAgentStart,
      query: bmdb.db
        .selectFrom('machine_provided as mp')
        .select('mp.machine_id')
        .where('mp.provider', '=', 'TogetherRaced')
        .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
        .where(sql<boolean>`(SELECT true FROM pg_advisory_xact_lock_shared(4343))`),
      toCandidate: (row) => row.machine_id,
    };
    await holder.query('BEGIN');
    await holder.query('SELECT pg_advisory_xact_lock(4343)');
    const claiming = Promise.allSettled([a, b].map((s) => s.work(Process.ShepherdAgentStart, gated)));
    await waitForAdvisoryLockWaiter(db);
    await holder.query('UPDATE machines SET claim_version = claim_version + 1 WHERE machine_id = $1', [raced]);
    await holder.query(`INSERT INTO work VALUES ($1, $2, 'ShepherdRecovery')`, [raced, other.id]);
    await holder.query('COMMIT');

    const results = await claiming;
    const claimed = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.machineId] : []));
    expect(claimed).toEqual([free]);
    const refused = results.flatMap((r) => (r.status === 'rejected' ? [r.reason] : []));
    expect(refused).toHaveLength(1);
    expect(refused[0]).toBeInstanceOf(NothingToDoError);
    const { rows } = await db.admin('SELECT process FROM work WHERE machine_id = $1', [raced]);
    expect(rows).toEqual([{ process: 'ShepherdRecovery' }]);
    await closeAll([a, b, other]);
  });
});

describe('ends made together', () => {
  test('go as one statement; one whose claim was lost fails alone and writes nothing', async () => {
    const setup = await bmdb.startSession();
    const ids = (await provideMachines(setup, 3, 'EndsLost')) as [string, string, string];
    await setup.close();
    const workers = await sessions(3);
    const works = await Promise.all(workers.map((s, i) => claim(s, ids[i] as string)));
    // Another session took the second claim over after ours looked dead.
    await db.admin('DELETE FROM work WHERE machine_id = $1', [ids[1]]);
    const results = await Promise.allSettled(
      works.map((w, i) => w.finish({ set: { agentStarted: { publicKey: key(i + 1) } } })),
    );
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(results[1]?.status === 'rejected' && results[1].reason).toBeInstanceOf(WorkLostError);
    expect(works.map((w) => w.state)).toEqual(['finished', 'lost', 'finished']);
    const started = await db.admin(
      'SELECT machine_id, agent_public_key FROM machine_agent_started WHERE machine_id = ANY($1::uuid[])',
      [ids],
    );
    expect(new Map(started.rows.map((r) => [r.machine_id, new Uint8Array(r.agent_public_key)]))).toEqual(
      new Map([
        [ids[0], key(1)],
        [ids[2], key(3)],
      ]),
    );
    expect(await events(ids[1])).toEqual(['ShepherdAgentStart:Started']);
    expect(await statementsWriting('Finished', [ids[0], ids[2]])).toBe(1);
    await closeAll(workers);
  });

  test('of every kind mix: finish(), finish(tags), fail, cancel, and finish(fn) alongside', async () => {
    const setup = await bmdb.startSession();
    const ids = (await provideMachines(setup, 5, 'EndsMixed')) as [string, string, string, string, string];
    await setup.close();
    const session = await bmdb.startSession();
    // A backoff to clear, left by an earlier failure of the first machine.
    const earlier = await claim(session, ids[0]);
    await earlier.fail({ initial: 1_000, maximum: 1_000, exponent: 1 }, 'earlier');
    await db.admin("UPDATE work_backoff SET until = now() - interval '1 second'");
    const [bare, tagged, failing, cancelled, callback] = await Promise.all(ids.map((id) => claim(session, id)));
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    // The cancel makes its machine eligible again, and says so.
    const notified = new Promise<void>((resolve) =>
      listener.on('notification', (n) => {
        if (n.payload === 'work') resolve();
      }),
    );
    await listener.query('LISTEN bmdb_machines_changed');
    try {
      await Promise.all([
        bare?.finish(),
        tagged?.finish({ set: { agentStarted: { publicKey: key(7) } } }),
        failing?.fail({ initial: 60_000, maximum: 60_000, exponent: 1 }, 'agent did not answer'),
        cancelled?.cancel(),
        callback?.finish((q) => setAgentStarted(q, ids[4], { publicKey: key(9) })),
      ]);
      await notified;
    } finally {
      await listener.end();
    }
    expect(await events(ids[0])).toEqual([
      'ShepherdAgentStart:Started',
      'ShepherdAgentStart:Failed',
      'ShepherdAgentStart:Started',
      'ShepherdAgentStart:Finished',
    ]);
    expect(await events(ids[1])).toEqual(['ShepherdAgentStart:Started', 'ShepherdAgentStart:Finished']);
    expect(await events(ids[2])).toEqual(['ShepherdAgentStart:Started', 'ShepherdAgentStart:Failed']);
    expect(await events(ids[3])).toEqual(['ShepherdAgentStart:Started', 'ShepherdAgentStart:Canceled']);
    expect(await events(ids[4])).toEqual(['ShepherdAgentStart:Started', 'ShepherdAgentStart:Finished']);
    const backoffs = await db.admin(
      'SELECT machine_id, cause, last_interval_seconds FROM work_backoff WHERE machine_id = ANY($1::uuid[])',
      [ids],
    );
    expect(backoffs.rows).toEqual([{ machine_id: ids[2], cause: 'agent did not answer', last_interval_seconds: 60 }]);
    const started = await db.admin('SELECT machine_id FROM machine_agent_started WHERE machine_id = ANY($1::uuid[])', [
      ids,
    ]);
    expect(started.rows.map((r) => r.machine_id).sort()).toEqual([ids[1], ids[4]].sort());
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = ANY($1::uuid[])', [ids])).rowCount).toBe(0);
    // The four statement ends shared one statement.
    expect(await statementsWriting('Finished', [ids[0], ids[1]])).toBe(1);
    const { rows } = await db.admin(
      `SELECT count(DISTINCT "timestamp")::int AS n FROM work_history
       WHERE event <> 'Started' AND machine_id = ANY($1::uuid[]) AND "timestamp" > (
         SELECT max("timestamp") FROM work_history WHERE event = 'Started' AND machine_id = ANY($1::uuid[]))`,
      [ids.slice(0, 4)],
    );
    expect(rows[0].n).toBe(1);
    await session.close();
  });

  test("one end's value PostgreSQL refuses fails that end alone", async () => {
    const setup = await bmdb.startSession();
    const ids = (await provideMachines(setup, 3, 'EndsBadValue')) as [string, string, string];
    await setup.close();
    const session = await bmdb.startSession();
    const works = await Promise.all(ids.map((id) => claim(session, id)));
    const results = await Promise.allSettled([
      works[0]?.finish({ set: { agentStarted: { publicKey: key(1) } } }),
      // Before 4713 BC: no timestamptz holds it.
      works[1]?.finish({ set: { agentStarted: { publicKey: key(2), startedAt: new Date(-8.64e15) } } }),
      works[2]?.fail(undefined, 'a NUL \u0000 in the cause'),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(works.map((w) => w.state)).toEqual(['finished', 'active', 'failed']);
    expect(await events(ids[1])).toEqual(['ShepherdAgentStart:Started']);
    const { rows } = await db.admin('SELECT cause FROM work_backoff WHERE machine_id = $1', [ids[2]]);
    expect(rows).toEqual([{ cause: 'a NUL \uFFFD in the cause' }]);
    await works[1]?.cancel();
    await session.close();
  });

  test('two ends on one machine never share a statement: the second follows the first', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'EndsOneMachine')) as [string];
    const starting = await claim(session, machineId, 'Starting');
    const stopping = await claim(session, machineId, 'Stopping');
    // In one statement the delete would not see the row the set inserts; in order, it removes it.
    await Promise.all([
      starting.finish({ set: { agentStarted: { publicKey: key(1) } } }),
      stopping.finish({ delete: ['agentStarted'] }),
    ]);
    expect((await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId])).rowCount).toBe(0);
    expect(await statementsWriting('Finished', [machineId])).toBe(2);
    await session.close();
  });
});
