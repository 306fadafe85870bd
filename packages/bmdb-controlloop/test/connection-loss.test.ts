import {
  agentStartSelection,
  machinesForAgentStart,
  Process,
  type ProvidedMachine,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually } from '../../../test/support/wait.js';
import { type BMDB, type ControlLoop, parseLimiter, runControlLoop, SessionExpiredError } from '../src/index.js';

let proxy: TcpProxy;
/** A connection through the proxy, with sessions short enough to see expire, long enough to outlive a blip. */
let flaky: BMDB;

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  const proxied = await TcpProxy.for(db.url);
  proxy = proxied.proxy;
  flaky = await openTestBMDB(db, { url: proxied.url, sessionInterval: 2_000, componentName: 'flaky' });
});
afterAll(() => proxy.close());

/** Cuts the database off for `ms`, starting now. */
function blip(ms: number): void {
  proxy.cut();
  setTimeout(() => proxy.restore(), ms);
}

const history = async (machineId: string) =>
  (await db.admin('SELECT event FROM work_history WHERE machine_id = $1 ORDER BY timestamp', [machineId])).rows.map(
    (r) => r.event,
  );

describe('ending work across a lost connection', () => {
  test.each([
    ['finish', 'Finished'],
    ['fail', 'Failed'],
    ['cancel', 'Canceled'],
  ] as const)('%s rides out a brief outage and is recorded once', async (end, event) => {
    const session = await flaky.startSession();
    const [machineId] = (await provideMachines(session, 1, `Blip${end}`)) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    blip(300);
    if (end === 'finish') await work.finish((q) => setAgentStarted(q, machineId, { publicKey: new Uint8Array(32) }));
    else if (end === 'fail') await work.fail(undefined, 'agent did not answer');
    else await work.cancel();
    expect(await history(machineId)).toEqual(['Started', event]);
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = $1', [machineId])).rowCount).toBe(0);
    expect(session.state).toBe('live');
    await session.close();
  });

  test('ends sharing a statement ride out an outage together, each recorded once', async () => {
    const session = await flaky.startSession();
    const ids = (await provideMachines(session, 3, 'BlipShared')) as [string, string, string];
    const works = await Promise.all(ids.map((id) => session.work(Process.ShepherdAgentStart, async () => [id])));
    blip(300);
    await Promise.all([
      works[0]?.finish({ set: { agentStarted: { publicKey: new Uint8Array(32) } } }),
      works[1]?.fail(undefined, 'agent did not answer'),
      works[2]?.cancel(),
    ]);
    expect(await history(ids[0])).toEqual(['Started', 'Finished']);
    expect(await history(ids[1])).toEqual(['Started', 'Failed']);
    expect(await history(ids[2])).toEqual(['Started', 'Canceled']);
    expect((await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [ids[0]])).rowCount).toBe(1);
    expect((await db.admin('SELECT 1 FROM work WHERE machine_id = ANY($1::uuid[])', [ids])).rowCount).toBe(0);
    expect(session.state).toBe('live');
    await session.close();
  });

  test('an attempt that committed before the connection was lost counts as done', async () => {
    const session = await flaky.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Committed')) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    proxy.cut();
    // As if the first attempt's COMMIT went through and only its answer was lost.
    await db.admin('DELETE FROM work WHERE machine_id = $1', [machineId]);
    setTimeout(() => proxy.restore(), 300);
    await work.finish();
    expect(work.state).toBe('finished');
    await session.close();
  });

  test('past the session deadline, the claim is left to the database and the error surfaces', async () => {
    const session = await flaky.startSession();
    const [machineId] = (await provideMachines(session, 1, 'LongOutage')) as [string];
    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    proxy.cut();
    try {
      await expect(work.fail(undefined, 'never recorded')).rejects.toThrow();
      expect(session.state).toBe('expired');
    } finally {
      proxy.restore();
    }
    // Released by expiry: no live session holds it. The session gave up by
    // its own clock, counted from when its last heartbeat was sent; the
    // database's deadline counted from when that heartbeat ran, up to one
    // round trip later (a loaded machine stretches it), so wait for it.
    const holders = async () =>
      (
        await db.admin(
          'SELECT 1 FROM work w JOIN sessions s USING (session_id) WHERE w.machine_id = $1 AND s.deadline > now()',
          [machineId],
        )
      ).rowCount;
    await eventually(
      'the database to count the session dead',
      async () => ((await holders()) === 0 ? true : undefined),
      5_000,
    );
    expect(await holders()).toBe(0);
  });
});

test('a shared claim whose outcome the connection lost gives up every session in it', async () => {
  const setup = await bmdb.startSession();
  const ids = await provideMachines(setup, 2, 'LostSharedClaim');
  await setup.close();
  const sessions = await Promise.all([flaky.startSession(), flaky.startSession()]);
  const selection = agentStartSelection(flaky.db, { provider: 'LostSharedClaim' });
  proxy.cut(); // the claim statement goes out on a dead connection, or none
  const restored = new Promise<void>((resolve) =>
    setTimeout(() => {
      proxy.restore();
      resolve();
    }, 300),
  );
  const results = await Promise.allSettled(sessions.map((s) => s.work(Process.ShepherdAgentStart, selection)));
  for (const result of results) {
    expect(result.status === 'rejected' && result.reason).toBeInstanceOf(SessionExpiredError);
  }
  for (const session of sessions) expect(session.state).not.toBe('live');
  await eventually(async () => {
    const held = await db.admin(
      'SELECT 1 FROM work w JOIN sessions s USING (session_id) WHERE w.machine_id = ANY($1::uuid[]) AND s.deadline > now()',
      [ids],
    );
    return held.rowCount === 0 ? true : undefined;
  }, 5_000);
  await restored; // leave the database reachable for the next test
});

test('a claim whose outcome the connection lost gives its session up, so the claim cannot stay held', async () => {
  const session = await flaky.startSession();
  const [machineId] = (await provideMachines(session, 1, 'LostClaim')) as [string];
  const claiming = session.work(Process.ShepherdAgentStart, async () => {
    proxy.cut(); // the claim statement goes out on a dead connection
    setTimeout(() => proxy.restore(), 300);
    return [machineId];
  });
  await expect(claiming).rejects.toBeInstanceOf(SessionExpiredError);
  expect(session.state).not.toBe('live'); // expired, and closed as soon as the database answers
  // Whatever the session held is released once its row is gone or expired.
  await eventually(async () => {
    const held = await db.admin(
      'SELECT 1 FROM work w JOIN sessions s USING (session_id) WHERE w.machine_id = $1 AND s.deadline > now()',
      [machineId],
    );
    return held.rowCount === 0 ? true : undefined;
  }, 5_000);
});

test('a claim losing its connection while an end is on its way gives the session up only after that end is recorded', async () => {
  // Once the last test's outage is over.
  const session = await eventually('the database reachable', () => flaky.startSession().catch(() => undefined));
  const [ending, next] = (await provideMachines(session, 2, 'EndThenLostClaim')) as [string, string];
  const work = await session.work(Process.ShepherdAgentStart, async () => [ending]);
  blip(300);
  const finishing = work.finish({ set: { agentStarted: { publicKey: new Uint8Array(32) } } });
  // A control loop's next claim, sent while the end is on its way, on the same dead connection.
  await expect(session.work(Process.ShepherdAgentStart, async () => [next])).rejects.toBeInstanceOf(
    SessionExpiredError,
  );
  await expect(session.work(Process.ShepherdAgentStart, async () => [next])).rejects.toBeInstanceOf(
    SessionExpiredError,
  ); // no new work while the session is being given up
  await finishing;
  expect(await history(ending)).toEqual(['Started', 'Finished']);
  expect((await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [ending])).rowCount).toBe(1);
  await eventually(async () => (session.state === 'live' ? undefined : true));
  await eventually(async () =>
    (await db.admin('SELECT 1 FROM work WHERE machine_id = $1', [next])).rowCount === 0 ? true : undefined,
  );
});

test('a task failing during a brief outage is recorded once the database is back, and processed again', async () => {
  const setup = await bmdb.startSession();
  const [machineId] = (await provideMachines(setup, 1, 'OutageLoop')) as [string];
  await setup.close();
  let calls = 0;
  const loop: ControlLoop<ProvidedMachine> = {
    process: Process.ShepherdAgentStart,
    processor: 'outage-loop',
    defaultBackoff: { initial: 1_000, maximum: 1_000, exponent: 1 },
    getMachines: (q, limit) => machinesForAgentStart(q, { provider: 'OutageLoop', limit }),
    async processMachine(task) {
      if (++calls === 1) {
        blip(300);
        throw new Error('the work failed while the database was unreachable');
      }
      await task.work.finish((q) => setAgentStarted(q, task.candidate.machineId, { publicKey: new Uint8Array(32) }));
    },
  };
  const stop = new AbortController();
  const running = runControlLoop(flaky, loop, { claimLimiter: parseLimiter('10ms,10'), signal: stop.signal });
  try {
    await eventually(async () =>
      (await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId])).rowCount === 1
        ? true
        : undefined,
    );
  } finally {
    stop.abort();
    await running;
  }
  expect(calls).toBe(2);
  expect(await history(machineId)).toEqual(['Started', 'Failed', 'Started', 'Finished']);
});
