/**
 * Bugs of @bmaas/bmdb-controlloop the chaos scenarios exposed, each as a
 * precise test of the behaviour we want, marked `test.fails` while the
 * library (being reworked by others) still has the bug. When one of these
 * starts to fail, the bug is fixed: drop the `.fails`.
 */
import {
  type BMDB,
  type ControlLoop,
  Process,
  type ProvidedMachine,
  parseLimiter,
  runControlLoop,
} from '@bmaas/bmdb-controlloop';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, type TestDatabase } from '../support/database.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { sleep } from './helpers.js';

let db: TestDatabase;
let bmdb: BMDB;
let proxy: TcpProxy;
let cutOff: BMDB;

beforeAll(async () => {
  db = await createTestDatabase();
  bmdb = await openTestBMDB(db);
  const proxied = await TcpProxy.for(db.url);
  proxy = proxied.proxy;
  // A session interval of 1 s: a brief outage of 300 ms leaves every session alive.
  cutOff = await openTestBMDB(db, { url: proxied.url, sessionInterval: 1_000 });
});
afterAll(() => proxy.close());

/*
 * A task that throws while the database is briefly unreachable: the runner
 * cannot record the failure (`work.fail`) nor release the claim
 * (`work.cancel`), logs both and moves on. The database is back within the
 * session's deadline, so the session lives on, heartbeating, and keeps the
 * claim: the machine is excluded from every selection (`hasLiveWork`) until
 * the process stops. Nothing retries the release. In the shepherd, a
 * PostgreSQL restart during an agent start left machines claimed for good
 * (the Initializer now retries its finish, which covers the agent-started
 * case only; any task that fails during an outage is still stuck).
 *
 * Wanted: once the database is back, the failure is recorded (or the claim
 * released), so the machine is processed again.
 */
test.fails('a claim whose failure could not be recorded during a brief outage is released once the database is back', async () => {
  const setup = await bmdb.startSession();
  const machineId = await setup.transact(async (q) => {
    const id = await q.newMachine();
    await q.addProvided(id, { provider: 'ChaosProbe', providerId: 'probe-1' });
    return id;
  });
  await setup.close();

  let calls = 0;
  let restored = 0;
  const loop: ControlLoop<ProvidedMachine> = {
    process: Process.ShepherdAgentStart,
    processor: 'chaos-probe',
    defaultBackoff: { initial: 1_000, maximum: 1_000, exponent: 1 },
    getMachines: (q, limit) => q.machinesForAgentStart({ provider: 'ChaosProbe', limit }),
    async processMachine(task) {
      if (++calls === 1) {
        proxy.cut();
        setTimeout(() => {
          proxy.restore();
          restored = Date.now();
        }, 300);
        throw new Error('the work failed while the database was unreachable');
      }
      await task.work.finish((q) => q.setAgentStarted(task.machine.machineId, { publicKey: new Uint8Array(32) }));
    },
  };
  const stop = new AbortController();
  const running = runControlLoop(cutOff, loop, {
    dbQueryLimiter: parseLimiter('10ms,10'),
    signal: stop.signal,
    sessionInterval: 1_000,
  });
  let started = false;
  try {
    // Five session intervals after the database is back, the machine should be done.
    const deadline = Date.now() + 10_000;
    while (!started && (restored === 0 || Date.now() < restored + 5_000) && Date.now() < deadline) {
      await sleep(100);
      started =
        (await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [machineId])).rowCount === 1;
    }
    const held = await db.admin(
      `SELECT s.session_id FROM work w JOIN sessions s USING (session_id)
         WHERE w.machine_id = $1 AND s.deadline > now()`,
      [machineId],
    );
    // With the bug: still claimed, by a live session, and processed only once.
    expect({ started, calls, claimedByLiveSession: held.rowCount }).toEqual({
      started: true,
      calls: 2,
      claimedByLiveSession: 0,
    });
  } finally {
    stop.abort();
    await running;
  }
});

/*
 * A heartbeat time ahead of the database's clock is stored as given
 * (`Queries.setAgentHeartbeat(machine, at)`), and the recovery selection
 * trusts it: an agent whose writer's clock runs a year fast looks alive for a
 * year, however silent, and `fleetStats` counts it as heartbeating. (The
 * shepherd's Recoverer now logs such machines; it cannot safely reboot them.)
 *
 * Wanted: a heartbeat is never recorded later than the database's now(), so
 * a silent agent is found by the usual thresholds.
 */
test.fails('a heartbeat stamped in the future is recorded no later than the database clock', async () => {
  const session = await bmdb.startSession();
  try {
    const machineId = await session.transact(async (q) => {
      const id = await q.newMachine();
      await q.addProvided(id, { provider: 'ChaosClock', providerId: 'clock-1' });
      await q.setAgentStarted(id, { publicKey: new Uint8Array(32), startedAt: new Date(Date.now() - 3_600_000) });
      await q.setAgentHeartbeat(id, new Date(Date.now() + 365 * 86_400_000));
      return id;
    });
    const { rows } = await db.admin(
      'SELECT agent_heartbeat_at <= now() AS sane FROM machine_agent_heartbeat WHERE machine_id = $1',
      [machineId],
    );
    expect(rows[0]?.sane).toBe(true);
  } finally {
    await session.close();
  }
});
