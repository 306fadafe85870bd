import { Process, setAgentStarted } from '@bmaas/bmdb-model';
import { Registry } from 'prom-client';
import { expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { agentStartCandidates, provideMachines } from '../../../test/support/machines.js';
import { eventually } from '../../../test/support/wait.js';
import { NothingToDoError, type Session } from '../src/index.js';

const registry = new Registry();

const { db, bmdb } = await testBMDB({ metrics: registry, componentName: 'heartbeats' });

/** A counter's value summed over the series whose labels include `labels`. */
async function counted(name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = (await registry.getMetricsAsJSON()).find((m) => m.name === name);
  return (metric?.values ?? [])
    .filter((value) => Object.entries(labels).every(([key, wanted]) => value.labels[key] === wanted))
    .reduce((sum, value) => sum + value.value, 0);
}

/** Claims and finishes agent starts until stopped, providing machines when it runs out. */
async function claimAndFinish(session: Session, stop: AbortSignal): Promise<number> {
  let finished = 0;
  while (!stop.aborted) {
    try {
      const work = await session.work(Process.ShepherdAgentStart, agentStartCandidates);
      await work.finish((q) =>
        setAgentStarted(q, work.machineId, { publicKey: crypto.getRandomValues(new Uint8Array(32)) }),
      );
      finished++;
    } catch (error) {
      if (!(error instanceof NothingToDoError)) throw error;
      await provideMachines(session, 5);
    }
  }
  return finished;
}

/** Starts sessions and moves their deadline into the past, for the collector; collects until stopped. */
async function expireAndCollect(stop: AbortSignal): Promise<number> {
  let collected = 0;
  while (!stop.aborted) {
    const doomed = await bmdb.startSession({ processor: 'doomed', interval: 1000 });
    await db.admin("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", [doomed.id]);
    collected += (await bmdb.collectExpiredSessions()).sessions;
  }
  return collected;
}

test('heartbeats see no serialization failures under parallel claims, finishes and collection', async () => {
  // A 2 s interval: a session expires only if its heartbeats stall for two seconds, not one
  // (test files run in parallel, and a loaded machine's scheduler can stall this one for a second).
  const workers = await Promise.all(
    Array.from({ length: 6 }, () => bmdb.startSession({ processor: 'busy', interval: 2000 })),
  );
  const stop = new AbortController();
  const errors: unknown[] = [];
  let contended = 0;
  // The load's own transactions retry serialization failures a bounded number of times; one that
  // gives up under this contention is counted and the loop goes on. Anything else (a session
  // expired, say) stops them all.
  const untilError = async (loop: () => Promise<number>): Promise<number> => {
    let done = 0;
    while (!stop.signal.aborted) {
      try {
        done += await loop();
      } catch (error) {
        if ((error as { code?: unknown }).code === '40001') {
          contended++;
          continue;
        }
        errors.push(error);
        stop.abort();
      }
    }
    return done;
  };
  const running = Promise.all([
    ...workers.map((session) => untilError(() => claimAndFinish(session, stop.signal))),
    untilError(() => expireAndCollect(stop.signal)),
  ]);
  try {
    // Each session beats every second: wait for 120 of the busy sessions' beats.
    await eventually(async () => {
      if (stop.signal.aborted) return true;
      return (await counted('bmdb_session_heartbeat_total', { processor: 'busy' })) >= 120 ? true : undefined;
    }, 60_000);
  } finally {
    stop.abort();
  }
  const done = await running;
  const finished = done.slice(0, workers.length).reduce((sum, n) => sum + n, 0);
  const collected = done.slice(workers.length).reduce((sum, n) => sum + n, 0);
  const beats = await counted('bmdb_session_heartbeat_total', { processor: 'busy' });
  const failures = await counted('bmdb_session_heartbeat_failed_total', { processor: 'busy' });
  const serialization = await counted('bmdb_session_heartbeat_failed_total', { processor: 'busy', code: '40001' });
  console.log(
    `${beats} heartbeats of 6 sessions alongside ${finished} claims and finishes and ${collected} sessions collected: ` +
      `${failures} failed, ${serialization} of them for serialization (40001); ` +
      `${contended} load transactions gave up on contention`,
  );
  expect(errors).toEqual([]);
  expect(finished).toBeGreaterThan(0);
  expect(collected).toBeGreaterThan(0);
  expect(serialization).toBe(0);
  expect(failures).toBe(0);
  for (const session of workers) {
    expect(session.state).toBe('live');
    await session.close();
  }
});
