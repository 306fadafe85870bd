import type { Database } from '@bmaas/bmdb-controlloop';
import {
  agentStartSelection,
  deleteAgentStarted,
  machinesForAgentStart,
  Process,
  type ProvidedMachine,
  SHEPHERD_PROCESSES,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';
import { sql } from 'kysely';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually } from '../../../test/support/wait.js';
import {
  type ControlLoop,
  hasLiveWork,
  parseLimiter,
  type RateLimiter,
  runControlLoop,
  SessionExpiredError,
  type Task,
} from '../src/index.js';
import { deferred } from './helpers.js';

const { db, bmdb } = await testBMDB();

const fast = () => parseLimiter('1ms,1000');
const key = () => crypto.getRandomValues(new Uint8Array(32));

/** How a loop names its machines: a selection (one-statement claims) or a retriever. */
type Claims = 'selectMachines' | 'getMachines';

function agentStartLoop(
  provider: string,
  processMachine: (task: Task<ProvidedMachine>) => Promise<void>,
  claims: Claims = 'selectMachines',
): ControlLoop<ProvidedMachine> {
  return {
    process: Process.ShepherdAgentStart,
    processor: `loop-${provider}`,
    defaultBackoff: { initial: 60_000, maximum: 60_000, exponent: 1 },
    ...(claims === 'selectMachines'
      ? { selectMachines: (q: Kysely<Database>) => agentStartSelection(q, { provider }) }
      : { getMachines: (q: Kysely<Database>, limit: number) => machinesForAgentStart(q, { provider, limit }) }),
    processMachine,
  };
}

/**
 * A limiter that never binds, counting the claim attempts it lets through:
 * the tokens a worker takes at once, and its waits for one.
 */
function countingLimiter(): { limiter: RateLimiter; attempts: () => number } {
  const limiter = parseLimiter('1ms,1000');
  let attempts = 0;
  const counting = Object.assign(Object.create(limiter) as RateLimiter, {
    tryTake: () => {
      const taken = limiter.tryTake();
      if (taken) attempts++;
      return taken;
    },
    wait: (signal?: AbortSignal) => {
      attempts++;
      return limiter.wait(signal);
    },
  });
  return { limiter: counting, attempts: () => attempts };
}

/** Finishes the task by setting AgentStarted, like the initializer. */
const startAgent = (task: Task<ProvidedMachine>) =>
  task.work.finish((q) => setAgentStarted(q, task.candidate.machineId, { publicKey: key() }));

/** A machine's history events, oldest first. */
async function events(machineId: string): Promise<string[]> {
  const { rows } = await db.admin('SELECT event FROM work_history WHERE machine_id = $1 ORDER BY timestamp', [
    machineId,
  ]);
  return rows.map((r) => r.event);
}

async function count(sql: string, values: unknown[] = []): Promise<number> {
  return (await db.admin(sql, values)).rows[0].n;
}

describe('runControlLoop', () => {
  test.each<Claims>(['selectMachines', 'getMachines'])(
    'N parallel workers over M machines process every machine exactly once (%s)',
    async (claims) => {
      const provider = `ExactlyOnce-${claims}`;
      const session = await bmdb.startSession();
      const ids = await provideMachines(session, 60, provider);
      await session.close();
      const registry = new Registry();
      const measured = await openTestBMDB(db, { metrics: registry, componentName: `exactly-once-${claims}` });
      const seen = new Map<string, number>();
      const stop = new AbortController();
      const running = runControlLoop(
        measured,
        agentStartLoop(
          provider,
          async (task) => {
            seen.set(task.candidate.machineId, (seen.get(task.candidate.machineId) ?? 0) + 1);
            await new Promise((resolve) => setTimeout(resolve, Math.random() * 10));
            await startAgent(task);
          },
          claims,
        ),
        { parallelism: 8, claimLimiter: fast(), signal: stop.signal },
      );
      await eventually(async () =>
        (await count('SELECT count(*)::int AS n FROM machine_agent_started WHERE machine_id = ANY($1::uuid[])', [
          ids,
        ])) >= 60
          ? true
          : undefined,
      );
      stop.abort();
      await running;

      expect([...seen.keys()].sort()).toEqual([...ids].sort());
      expect([...seen.values()].every((n) => n === 1)).toBe(true);
      const events = await db.admin(
        `SELECT machine_id, array_agg(event ORDER BY timestamp) AS events FROM work_history
       WHERE machine_id = ANY($1::uuid[]) GROUP BY machine_id`,
        [ids],
      );
      expect(events.rows).toHaveLength(60);
      for (const row of events.rows) expect(row.events).toEqual(['Started', 'Finished']);
      expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
      expect(
        await count('SELECT count(*)::int AS n FROM sessions WHERE component_name = $1', [`exactly-once-${claims}`]),
      ).toBe(0);

      const metrics = await registry.getMetricsAsJSON();
      const value = (name: string, labels: Record<string, string>) =>
        metrics
          .find((m) => m.name === name)
          ?.values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))?.value;
      const labels = { processor: `loop-${provider}`, process: 'ShepherdAgentStart' };
      expect(value('bmdb_work_started_total', labels)).toBe(60);
      expect(value('bmdb_work_finished_total', { ...labels, result: 'finished' })).toBe(60);
      expect(value('bmdb_session_started_total', { processor: `loop-${provider}` })).toBe(8);
      await measured.close();
    },
  );

  test('a throwing processMachine fails the work with the task backoff and the error as cause', async () => {
    const session = await bmdb.startSession();
    const [failing, overridden] = (await provideMachines(session, 2, 'Failing')) as [string, string];
    await session.close();
    const stop = new AbortController();
    const running = runControlLoop(
      bmdb,
      agentStartLoop('Failing', async (task) => {
        if (task.candidate.machineId === overridden)
          task.backoff = { initial: 7_200_000, maximum: 7_200_000, exponent: 1 };
        throw new Error(`dial ${task.candidate.providerId}: connection refused`);
      }),
      { claimLimiter: fast(), signal: stop.signal },
    );
    await eventually(async () =>
      (await count('SELECT count(*)::int AS n FROM work_backoff')) >= 2 ? true : undefined,
    );
    stop.abort();
    await running;

    const { rows } = await db.admin(
      `SELECT b.machine_id, b.cause, b.last_interval_seconds, p.provider_id FROM work_backoff b
       JOIN machine_provided p USING (machine_id) WHERE p.provider = 'Failing'`,
    );
    const byMachine = new Map(rows.map((r) => [r.machine_id, r]));
    expect(byMachine.get(failing)?.cause).toBe(`dial ${byMachine.get(failing)?.provider_id}: connection refused`);
    expect(byMachine.get(failing)?.last_interval_seconds).toBe(60);
    expect(byMachine.get(overridden)?.last_interval_seconds).toBe(7200);
    const history = await db.admin(
      'SELECT event, failed_cause FROM work_history WHERE machine_id = $1 ORDER BY timestamp',
      [failing],
    );
    expect(history.rows.map((r) => r.event)).toEqual(['Started', 'Failed']);
  });

  test('returning without finishing releases the claim as Canceled', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Unfinished')) as [string];
    await session.close();
    const stop = new AbortController();
    const done = deferred();
    const running = runControlLoop(
      bmdb,
      agentStartLoop('Unfinished', async () => {
        done.resolve();
        stop.abort();
      }),
      { claimLimiter: fast(), signal: stop.signal },
    );
    await done.promise;
    await running;
    expect(await events(machineId)).toEqual(['Started', 'Canceled']);
  });

  test('a worker claims its next machine while its last work ends, and starts the next task only after the last returned', async () => {
    const session = await bmdb.startSession();
    const ids = await provideMachines(session, 2, 'ClaimAhead');
    await session.close();
    const ahead = await openTestBMDB(db, { componentName: 'claim-ahead' });
    const stop = new AbortController();
    const gate = deferred();
    const finished = deferred();
    const processed: string[] = [];
    let running = 0;
    let mostRunning = 0;
    const loop = runControlLoop(
      ahead,
      agentStartLoop('ClaimAhead', async (task) => {
        mostRunning = Math.max(mostRunning, ++running);
        processed.push(task.candidate.machineId);
        await task.work.finish({ set: { agentStarted: { publicKey: key() } } });
        if (processed.length === 1) {
          finished.resolve();
          await gate.promise; // the first task lingers after its work ended
        }
        running--;
      }),
      { claimLimiter: fast(), signal: stop.signal },
    );
    try {
      await finished.promise;
      // The other machine is claimed by the same worker's session, not processed yet.
      const [first] = processed as [string];
      const other = ids.find((id) => id !== first) as string;
      await eventually(
        'the other machine claimed ahead',
        async () =>
          (await count(
            `SELECT count(*)::int AS n FROM work w JOIN sessions s USING (session_id)
           WHERE w.machine_id = $1 AND s.component_name = 'claim-ahead'`,
            [other],
          )) === 1
            ? true
            : undefined,
        5_000,
      );
      expect(processed).toEqual([first]);
      gate.resolve();
      await eventually(async () => (processed.length === 2 ? true : undefined));
      await eventually(async () => (running === 0 ? true : undefined));
    } finally {
      gate.resolve();
      stop.abort();
      await loop;
    }
    expect(mostRunning).toBe(1);
    expect(
      await count(
        "SELECT count(*)::int AS n FROM work_history WHERE event = 'Finished' AND machine_id = ANY($1::uuid[])",
        [ids],
      ),
    ).toBe(2);
  });

  test('a machine claimed ahead when the loop stops is given back, recorded Canceled', async () => {
    const session = await bmdb.startSession();
    const ids = await provideMachines(session, 2, 'AheadAtStop');
    await session.close();
    const ahead = await openTestBMDB(db, { componentName: 'ahead-at-stop' });
    const stop = new AbortController();
    const processed: string[] = [];
    const loop = runControlLoop(
      ahead,
      agentStartLoop('AheadAtStop', async (task) => {
        processed.push(task.candidate.machineId);
        await task.work.finish({ set: { agentStarted: { publicKey: key() } } });
        // By now the next machine is claimed (or being claimed): stop before it is processed.
        await eventually(
          'the next machine claimed ahead',
          async () =>
            (await count(
              `SELECT count(*)::int AS n FROM work w JOIN sessions s USING (session_id)
             WHERE s.component_name = 'ahead-at-stop'`,
            )) === 1
              ? true
              : undefined,
          5_000,
        );
        stop.abort();
      }),
      { claimLimiter: fast(), signal: stop.signal },
    );
    await loop;
    expect(processed).toHaveLength(1);
    const other = ids.find((id) => id !== processed[0]) as string;
    expect(await events(other)).toEqual(['Started', 'Canceled']);
    expect(await count('SELECT count(*)::int AS n FROM work WHERE machine_id = ANY($1::uuid[])', [ids])).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'ahead-at-stop'")).toBe(0);
  });

  test('a clean stop lets in-flight work finish, then closes every session', async () => {
    const session = await bmdb.startSession();
    const ids = await provideMachines(session, 3, 'CleanStop');
    await session.close();
    const clean = await openTestBMDB(db, { componentName: 'clean-stop' });
    const stop = new AbortController();
    const gate = deferred();
    const inFlight = new Set<string>();
    const running = runControlLoop(
      clean,
      agentStartLoop('CleanStop', async (task) => {
        inFlight.add(task.candidate.machineId);
        await gate.promise;
        await startAgent(task);
      }),
      { parallelism: 3, claimLimiter: fast(), signal: stop.signal },
    );
    await eventually(async () => (inFlight.size === 3 ? true : undefined));
    stop.abort();
    gate.resolve(); // in-flight work ends after the stop signal, within the grace period
    await running;

    const finished = await count(
      `SELECT count(*)::int AS n FROM work_history WHERE event = 'Finished' AND machine_id = ANY($1::uuid[])`,
      [ids],
    );
    expect(finished).toBe(3);
    expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'clean-stop'")).toBe(0);
  });

  test('work still running after the grace period is cancelled and released', async () => {
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Stuck')) as [string];
    await session.close();
    const stuck = await openTestBMDB(db, { componentName: 'stuck' });
    const stop = new AbortController();
    const started = deferred<AbortSignal>();
    const running = runControlLoop(
      stuck,
      agentStartLoop('Stuck', (task) => {
        started.resolve(task.signal);
        return new Promise(() => {}); // ignores its signal: a hung SSH call, say
      }),
      { claimLimiter: fast(), signal: stop.signal, stopGracePeriod: 200 },
    );
    const taskSignal = await started.promise;
    stop.abort();
    await running;
    expect(taskSignal.aborted).toBe(true);
    expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
    expect(await count("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'stuck'")).toBe(0);
    expect(await events(machineId)).toEqual(['Started', 'Canceled']);
  });

  test('a database outage expires the sessions; the loop starts new ones and carries on', async () => {
    const { proxy, url } = await TcpProxy.for(db.url);
    afterAll(() => proxy.close());
    const outage = await openTestBMDB(db, { url, componentName: 'outage', sessionInterval: 1000 });
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 5, 'Outage');
    await setup.close();

    const stop = new AbortController();
    const first = deferred<AbortSignal>();
    let calls = 0;
    const running = runControlLoop(
      outage,
      agentStartLoop('Outage', async (task) => {
        if (++calls === 1) {
          first.resolve(task.signal);
          // Wait for the session to die, like an SSH call outliving an outage.
          await new Promise((_, reject) => task.signal.addEventListener('abort', () => reject(task.signal.reason)));
        }
        await startAgent(task);
      }),
      { parallelism: 2, claimLimiter: fast(), signal: stop.signal },
    );
    const firstSignal = await first.promise;
    proxy.cut();
    await eventually(async () => (firstSignal.aborted ? true : undefined), 3000);
    expect(firstSignal.reason).toBeInstanceOf(SessionExpiredError);
    // The outage lasts until the database, too, considers the session dead.
    const expired = (firstSignal.reason as SessionExpiredError).sessionId;
    await eventually(async () =>
      (await count('SELECT count(*)::int AS n FROM sessions WHERE session_id = $1 AND deadline > now()', [expired])) ===
      0
        ? true
        : undefined,
    );
    proxy.restore();

    await eventually(async () =>
      (await count('SELECT count(*)::int AS n FROM machine_agent_started WHERE machine_id = ANY($1::uuid[])', [
        ids,
      ])) === 5
        ? true
        : undefined,
    );
    stop.abort();
    await running;
    expect(
      await count("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'outage' AND deadline > now()"),
    ).toBe(0);
    expect(
      await count('SELECT count(*)::int AS n FROM work w JOIN sessions s USING (session_id) WHERE s.deadline > now()'),
    ).toBe(0);
  });

  test('an idle worker is woken by the notification of a newly provided machine, not by polling', async () => {
    const quiet = await openTestBMDB(db, { componentName: 'notified' });
    const stop = new AbortController();
    const picked = deferred<string>();
    const { limiter: counting, attempts: claimAttempts } = countingLimiter();
    const running = runControlLoop(
      quiet,
      agentStartLoop('Notified', async (task) => {
        picked.resolve(task.candidate.machineId);
        await startAgent(task);
      }),
      // Without notifications, an idle worker would look again only every 10 minutes.
      { claimLimiter: counting, signal: stop.signal, maxIdleDelay: 600_000 },
    );
    // Once the loop hears notifications, an idle worker waits out maxIdleDelay between looks.
    await eventually(async () => (quiet.machineChanges.listening && claimAttempts() >= 2 ? true : undefined));
    const session = await bmdb.startSession();
    const [machineId] = (await provideMachines(session, 1, 'Notified')) as [string];
    await session.close();
    expect(await picked.promise).toBe(machineId);
    stop.abort();
    await running;
  });

  test('notifications: a provided machine, a released claim, a removed agent or backoff wake waiters', async () => {
    const changes = bmdb.machineChanges;
    const signal = new AbortController().signal;
    // The first wait starts listening; a (re)connection itself counts as a change.
    await changes.wait(changes.generation, 10, signal);
    await eventually(async () => (changes.listening ? true : undefined));
    /** Resolves only on a notification: the timeout is far beyond the test's. */
    const nextChange = () => changes.wait(changes.generation, 600_000, signal);
    const session = await bmdb.startSession();

    let woken = nextChange();
    const [machineId] = (await provideMachines(session, 1, 'Wakes')) as [string];
    await woken;

    const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    woken = nextChange();
    await work.cancel();
    await woken;

    await session.transact((q) => setAgentStarted(q, machineId, { publicKey: key() }));
    woken = nextChange();
    await session.transact((q) => deleteAgentStarted(q, machineId));
    await woken;

    const failed = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    await failed.fail(undefined, 'test');
    woken = nextChange();
    await db.admin('DELETE FROM work_backoff WHERE machine_id = $1', [machineId]);
    await woken;

    await session.work(Process.ShepherdAgentStart, async () => [machineId]);
    woken = nextChange();
    await session.close();
    await woken;
  });

  test('a notification wakes one idle worker; one that finds work wakes the next', async () => {
    const herd = await openTestBMDB(db, { componentName: 'herd' });
    const stop = new AbortController();
    const { limiter: counting, attempts: claimAttempts } = countingLimiter();
    const processed: string[] = [];
    const running = runControlLoop(
      herd,
      agentStartLoop('Herd', async (task) => {
        processed.push(task.candidate.machineId);
        await startAgent(task);
      }),
      { parallelism: 6, claimLimiter: counting, signal: stop.signal, maxIdleDelay: 600_000 },
    );
    // Every worker idle, waiting for a notification (and nothing else, for 10 minutes).
    await eventually(async () =>
      herd.machineChanges.listening && herd.machineChanges.waiting === 6 ? true : undefined,
    );
    const before = claimAttempts();
    const session = await bmdb.startSession();
    const ids = await provideMachines(session, 3, 'Herd');
    await session.close();
    await eventually(async () => (processed.length === 3 ? true : undefined));
    stop.abort();
    await running;
    expect(processed.sort()).toEqual([...ids].sort());
    // Woken in turn, three workers claim and look once more each after their task, and a fourth
    // finds nothing: 7 looks. Waking all six on the notification makes it 9 or more.
    expect(claimAttempts() - before).toBeLessThanOrEqual(8);
  });

  test('two loops of different shepherd processes never hold one machine at once', async () => {
    const setup = await bmdb.startSession();
    const ids = await provideMachines(setup, 6, 'Exclusive');
    await setup.close();
    const held = new Map<string, string>();
    const overlaps: string[] = [];
    let claims = 0;
    const stop = new AbortController();
    const loopFor = (process: string): ControlLoop<ProvidedMachine> => ({
      process,
      processor: `exclusive-${process}`,
      defaultBackoff: { initial: 60_000, maximum: 60_000, exponent: 1 },
      // Every machine of the provider without live shepherd work: both loops want the same machines.
      selectMachines: (q) => ({
        process,
        query: q
          .selectFrom('machine_provided as mp')
          .selectAll('mp')
          .where('mp.provider', '=', 'Exclusive')
          .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`),
        // A selection's rows are its query's: narrow the parameter to them.
        toCandidate: (row: { machine_id: string; provider_id: string }) =>
          ({ machineId: row.machine_id, providerId: row.provider_id }) as ProvidedMachine,
      }),
      async processMachine({ candidate }) {
        const holder = held.get(candidate.machineId);
        if (holder) overlaps.push(`${candidate.machineId} held by ${holder} and ${process}`);
        held.set(candidate.machineId, process);
        await new Promise((resolve) => setTimeout(resolve, Math.random() * 3));
        held.delete(candidate.machineId);
        if (++claims >= 400) stop.abort();
        // Returning without finishing releases the claim: the machine is wanted again at once.
      },
    });
    const options = { parallelism: 6, claimLimiter: fast(), signal: stop.signal };
    await Promise.all([
      runControlLoop(bmdb, loopFor(Process.ShepherdAgentStart), options),
      runControlLoop(bmdb, loopFor(Process.ShepherdRecovery), options),
    ]);
    expect(overlaps).toEqual([]);
    expect(claims).toBeGreaterThanOrEqual(400);
    const processes = await db.admin(
      `SELECT count(DISTINCT process)::int AS n FROM work_history WHERE machine_id = ANY($1::uuid[])`,
      [ids],
    );
    expect(processes.rows[0].n).toBe(2);
  });

  test('refuses a loop without selectMachines or getMachines', async () => {
    const { getMachines: _, selectMachines: __, ...loop } = agentStartLoop('None', async () => {});
    await expect(
      runControlLoop(bmdb, loop, { claimLimiter: fast(), signal: new AbortController().signal }),
    ).rejects.toThrow(/neither selectMachines nor getMachines/);
  });

  test('refuses a parallelism that is not a positive integer', async () => {
    const loop = agentStartLoop('None', async () => {});
    await expect(
      runControlLoop(bmdb, loop, { parallelism: 0, claimLimiter: fast(), signal: new AbortController().signal }),
    ).rejects.toThrow(/parallelism must be a positive integer, got 0/);
  });
});
