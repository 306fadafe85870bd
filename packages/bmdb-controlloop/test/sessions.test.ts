import { performance } from 'node:perf_hooks';
import { machinesForAgentStart, newMachine, Process } from '@bmaas/bmdb-model';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { agentStartCandidates, provideMachines } from '../../../test/support/machines.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually } from '../../../test/support/wait.js';
import { type BMDB, NothingToDoError, SessionClosedError, SessionExpiredError, WorkEndedError } from '../src/index.js';
import { deferred } from './helpers.js';

let proxy: TcpProxy;
let proxiedUrl: string;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  ({ proxy, url: proxiedUrl } = await TcpProxy.for(db.url));
});
afterAll(() => proxy.close());

/** A second connection, as another process would have, reaching the database through the proxy. */
async function openProxiedBMDB(): Promise<BMDB> {
  proxy.restore();
  return openTestBMDB(db, { url: proxiedUrl, componentName: 'proxied' });
}

/** Waits until the database's clock is past `moment`. */
async function databaseTimePast(moment: Date): Promise<void> {
  await eventually(async () =>
    (await db.admin('SELECT now() > $1 AS past', [moment])).rows[0].past ? true : undefined,
  );
}

async function sessionRow(id: string) {
  const { rows } = await db.admin('SELECT deadline, deadline > now() AS live FROM sessions WHERE session_id = $1', [
    id,
  ]);
  return rows[0] as { deadline: Date; live: boolean } | undefined;
}

describe('sessions', () => {
  test('heartbeats keep a session alive past its first deadline', async () => {
    const session = await bmdb.startSession({ interval: 1000 });
    const first = await sessionRow(session.id);
    if (!first) throw new Error(`no row for session ${session.id}`);
    await databaseTimePast(first.deadline);
    expect(session.state).toBe('live');
    const later = await sessionRow(session.id);
    expect(later?.live).toBe(true);
    expect(later?.deadline.getTime()).toBeGreaterThan(first?.deadline.getTime() ?? Number.POSITIVE_INFINITY);
    await session.close();
  });

  test('a session whose deadline passed in the database expires; calls then fail with SessionExpiredError', async () => {
    const session = await bmdb.startSession({ interval: 1000 });
    // Move time: the database now considers the session dead; the next poke finds out.
    await db.admin("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", [session.id]);
    await eventually(async () => (session.state === 'expired' ? true : undefined), 3000);
    expect(session.signal.aborted).toBe(true);
    expect(session.signal.reason).toBeInstanceOf(SessionExpiredError);
    await expect(session.transact((q) => newMachine(q))).rejects.toBeInstanceOf(SessionExpiredError);
    await expect(session.work(Process.ShepherdAgentStart, agentStartCandidates)).rejects.toBeInstanceOf(
      SessionExpiredError,
    );
    await expect(session.transact(async () => 1)).rejects.toThrow(session.id);
  });

  test('a session expires once its heartbeats stop reaching the database, and stays expired', async () => {
    const other = await openProxiedBMDB();
    const session = await other.startSession({ interval: 1000 });
    proxy.cut();
    // Once the database considers it dead, it has expired here too: never later.
    await eventually(async () => ((await sessionRow(session.id))?.live === false ? true : undefined));
    expect(session.state).toBe('expired');
    proxy.restore();
    await expect(session.transact(async () => 1)).rejects.toBeInstanceOf(SessionExpiredError);
    await other.close();
  });

  test('a transient database outage during a heartbeat does not expire the session', async () => {
    const registry = new Registry();
    proxy.restore();
    const other = await openTestBMDB(db, { url: proxiedUrl, componentName: 'outage', metrics: registry });
    const failedBeats = async () =>
      (await registry.getMetricsAsJSON())
        .find((m) => m.name === 'bmdb_session_heartbeat_failed_total')
        ?.values.reduce((sum, v) => sum + v.value, 0) ?? 0;
    // Deadline at t=4s; the poke at t=2s falls inside the outage and fails.
    const session = await other.startSession({ interval: 4000 });
    const first = await sessionRow(session.id);
    if (!first) throw new Error(`no row for session ${session.id}`);
    proxy.cut();
    await eventually(async () => ((await failedBeats()) > 0 ? true : undefined));
    proxy.restore();
    // Past the original deadline: only a retried heartbeat can have kept it alive.
    await databaseTimePast(first.deadline);
    expect(session.state).toBe('live');
    expect((await sessionRow(session.id))?.live).toBe(true);
    await expect(session.transact(async (q) => newMachine(q))).resolves.toMatch(/-/);
    await other.close();
  });

  test('close() cancels live work, deletes the session and refuses further calls', async () => {
    const session = await bmdb.startSession();
    const [machineId] = await provideMachines(session, 1);
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId as string]);
    await session.close();

    expect((await db.admin('SELECT count(*)::int AS n FROM work WHERE session_id = $1', [session.id])).rows[0].n).toBe(
      0,
    );
    expect(await sessionRow(session.id)).toBeUndefined();
    const history = await bmdb.db
      .selectFrom('work_history')
      .select(['event', 'failed_cause'])
      .where('machine_id', '=', machineId as string)
      .orderBy('timestamp')
      .execute();
    expect(history.map((h) => h.event)).toEqual(['Started', 'Canceled']);
    expect(history[1]?.failed_cause).toContain(session.id);

    await expect(work.finish()).rejects.toBeInstanceOf(WorkEndedError);
    await expect(session.transact(async () => 1)).rejects.toBeInstanceOf(SessionClosedError);
    expect(session.signal.aborted).toBe(true);
    await session.close(); // idempotent
  });

  test('expired sessions are collected, releasing their work with a Canceled event', async () => {
    const other = await openProxiedBMDB();
    const session = await other.startSession({ interval: 1000 });
    const [machineId] = await provideMachines(session, 1);
    await session.work(Process.ShepherdAgentStart, async () => [machineId as string]);
    proxy.cut(); // the holder dies
    await eventually(async () => ((await sessionRow(session.id))?.live === false ? true : undefined), 3000);

    const collected = await bmdb.collectExpiredSessions();
    expect(collected.sessions).toBeGreaterThanOrEqual(1);
    expect(collected.work).toBeGreaterThanOrEqual(1);
    expect(await sessionRow(session.id)).toBeUndefined();
    const { rows } = await db.admin(
      `SELECT event, failed_cause FROM work_history WHERE machine_id = $1 ORDER BY timestamp`,
      [machineId],
    );
    expect(rows.map((r) => r.event)).toEqual(['Started', 'Canceled']);
    expect(rows[1].failed_cause).toBe(`session ${session.id} expired`);
    proxy.restore();
    await other.close();
  });

  test('a worker that dies holding a claim frees the machine once its deadline passes, at most one interval after its last heartbeat', async () => {
    const interval = 2000;
    const dying = await openProxiedBMDB();
    const worker = await dying.startSession({ interval });
    await provideMachines(worker, 1, 'Dying');
    const retriever = (q: Parameters<typeof agentStartCandidates>[0]) =>
      machinesForAgentStart(q, { provider: 'Dying', limit: 1 });
    const held = await worker.work(Process.ShepherdAgentStart, retriever);
    proxy.cut(); // the worker's host is gone: no heartbeats, no cleanup
    const diedAt = performance.now();
    const { rows: cut } = await db.admin('SELECT now() AS at');
    // Its last deadline, fixed from now on, is at most one interval after a heartbeat before the cut.
    const last = await sessionRow(worker.id);
    expect(last?.deadline.getTime()).toBeLessThanOrEqual(cut[0].at.getTime() + interval);

    const survivor = await bmdb.startSession({ interval });
    const work = await eventually(async () => {
      try {
        return await survivor.work(Process.ShepherdAgentStart, retriever);
      } catch (error) {
        if (error instanceof NothingToDoError) return undefined;
        throw error;
      }
    }, 20_000);
    expect(work.machineId).toBe(held.machineId);
    // Taken over once that deadline passed (claims take over expired sessions' work), never before.
    const { rows: started } = await db.admin(
      "SELECT max(timestamp) AS at FROM work_history WHERE machine_id = $1 AND event = 'Started'",
      [held.machineId],
    );
    expect(started[0].at.getTime()).toBeGreaterThanOrEqual(last?.deadline.getTime() ?? Number.POSITIVE_INFINITY);
    console.log(
      `machine of a dead worker taken over ${Math.round(performance.now() - diedAt)} ms after it died (interval ${interval} ms)`,
    );
    await work.finish();

    const { rows } = await db.admin(`SELECT event, failed_cause FROM work_history WHERE machine_id = $1`, [
      held.machineId,
    ]);
    const events = rows.map((r) => r.event).sort();
    expect(events).toEqual(['Canceled', 'Finished', 'Started', 'Started']);
    expect(rows.find((r) => r.event === 'Canceled')?.failed_cause).toContain(worker.id);
    await survivor.close();
    proxy.restore();
    await dying.close();
  });

  test('serialization failures are retried until the transaction commits', async () => {
    const registry = new Registry();
    const measured = await openTestBMDB(db, { metrics: registry, componentName: 'retry-test' });
    const a = await measured.startSession({ processor: 'retry-test' });
    const b = await measured.startSession({ processor: 'retry-test' });
    // Both read the same set, then both write into it: a write skew that
    // SERIALIZABLE refuses for one of them.
    const bothRead = [deferred(), deferred()] as const;
    let attempts = 0;
    const skew = (index: 0 | 1) => async (q: Parameters<Parameters<typeof a.transact>[0]>[0]) => {
      attempts++;
      await q
        .selectFrom('machines')
        .select((eb) => eb.fn.countAll().as('n'))
        .executeTakeFirstOrThrow();
      if (attempts <= 2) {
        bothRead[index].resolve();
        await bothRead[1 - index]?.promise;
      }
      return newMachine(q);
    };
    const [one, two] = await Promise.all([a.transact(skew(0)), b.transact(skew(1))]);
    expect(one).not.toBe(two);
    expect(attempts).toBeGreaterThanOrEqual(3);
    const metrics = await registry.getMetricsAsJSON();
    const retried = metrics.find((m) => m.name === 'bmdb_transaction_retried_total');
    expect(retried?.values.find((v) => v.labels.processor === 'retry-test')?.value).toBeGreaterThanOrEqual(1);
    const started = metrics.find((m) => m.name === 'bmdb_session_started_total');
    expect(started?.values.find((v) => v.labels.processor === 'retry-test')?.value).toBe(2);
    await measured.close();
  });
});
