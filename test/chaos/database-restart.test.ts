/**
 * Scenario 3, the database goes away: two shepherds run against a PostgreSQL
 * server of this file's own, which is restarted (fast shutdown) mid-run, and
 * then kept down for 30 s. The shepherds log the outage, stay up, and carry
 * on once it is back; no machine is lost and none is recorded twice.
 *
 * What "not doubled" can mean: an agent start that succeeds on the machine
 * while the BMDB cannot record it. Within the session's deadline (a restart)
 * the shepherd retries the record, so every agent is started exactly once.
 * Past it (the 30 s outage) the session expires, its claims are released, and
 * the agents whose start could not be recorded are started again: at least
 * once, and only those.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { sleep } from '@bmaas/common';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { shepherd } from '../../packages/cli/test/helpers.js';
import { PostgresServer } from '../support/postgres-server.js';
import {
  type AgentStart,
  agentStarts,
  buildOnce,
  ChaosShepherd,
  dummyArgs,
  eventually,
  killShepherdsAfterEach,
  overlappingStarts,
  query,
  readAgentLog,
  table,
} from './helpers.js';

const MACHINES = 40;
const AGENT_START = 1_000;

let server: PostgresServer;
let dir: string;

beforeAll(async () => {
  await buildOnce();
  server = await PostgresServer.start();
  dir = await mkdtemp(path.join(tmpdir(), 'chaos-db-'));
});
afterAll(async () => {
  await server?.destroy();
  await rm(dir, { recursive: true, force: true });
});
killShepherdsAfterEach();

/** A fresh BMDB on the server, two shepherds on it, and a look once some agents are started and more in flight. */
async function fleet(database: string) {
  const url = await server.createDatabase(database);
  expect((await shepherd(['migrate', '--bmdb-url', url])).code).toBe(0);
  const agentLog = path.join(dir, `${database}.jsonl`);
  const shepherds = ['a', 'b'].map(
    (name) =>
      new ChaosShepherd(
        name,
        dummyArgs({
          url,
          name: `chaos-${name}`,
          capacity: MACHINES,
          agentLog,
          agentStartDuration: `${AGENT_START}ms`,
        }),
        {},
      ),
  );
  const started = () =>
    query<{ n: number }>(url, 'SELECT count(*)::int AS n FROM machine_agent_started').then((r) => r[0]?.n ?? 0);
  await eventually(
    'some agents started and more in flight',
    async () => {
      const inFlight = agentStarts(readAgentLog(agentLog)).filter((s) => s.end === undefined).length;
      return (await started()) >= 8 && inFlight >= 4 ? true : undefined;
    },
    30_000,
  );
  return { url, agentLog, shepherds, started };
}

/** Waits for every agent, stops the shepherds cleanly, and checks the BMDB's record. */
async function settle(f: Awaited<ReturnType<typeof fleet>>, within: number) {
  const back = Date.now();
  const firstRecord = eventually(
    'an agent start recorded after the outage',
    async () => {
      const rows = await query<{ n: number }>(
        f.url,
        `SELECT count(*)::int AS n FROM work_history WHERE event = 'Finished' AND "timestamp" >= $1`,
        [new Date(back)],
      );
      return (rows[0]?.n ?? 0) > 0 ? Date.now() - back : undefined;
    },
    within,
  );
  await eventually('every agent started', async () => ((await f.started()) === MACHINES ? true : undefined), within);
  const recovered = Date.now() - back;
  const carriedOn = await firstRecord;
  for (const s of f.shepherds) expect(s.alive, `${s.name} exited:\n${s.stderr.slice(-3000)}`).toBe(true);
  // No claim of a dead session left behind, before the clean stop releases the rest.
  const stale = await query<{ n: number }>(
    f.url,
    'SELECT count(*)::int AS n FROM work w JOIN sessions s USING (session_id) WHERE s.deadline < now()',
  );
  expect(stale[0]?.n).toBe(0);
  await Promise.all(f.shepherds.map((s) => s.stop()));
  for (const s of f.shepherds) expect((await s.exited).code).toBe(0);
  expect((await query<{ n: number }>(f.url, 'SELECT count(*)::int AS n FROM work'))[0]?.n).toBe(0);
  // One Finished agent start per machine: nothing lost, nothing recorded twice.
  const finished = await query<{ n: number }>(
    f.url,
    `SELECT count(*)::int AS n FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Finished'
     GROUP BY machine_id`,
  );
  expect(finished).toHaveLength(MACHINES);
  expect(finished.every((row) => row.n === 1)).toBe(true);
  const starts = agentStarts(readAgentLog(f.agentLog));
  expect(overlappingStarts(starts)).toEqual([]);
  const perMachine = new Map<string, AgentStart[]>();
  for (const s of starts) perMachine.set(s.machine, [...(perMachine.get(s.machine) ?? []), s]);
  const doubled = [...perMachine.values()].filter((list) => list.length > 1);
  return { recovered, carriedOn, starts, doubled };
}

/** The outage in the shepherds' logs: one line each at least, and how many. */
function outageLines(shepherds: readonly ChaosShepherd[]): number[] {
  return shepherds.map(
    (s) => s.lines(/ECONNREFUSED|terminating connection due to administrator command|shutting down/).length,
  );
}

test('PostgreSQL restarted (fast shutdown) mid-run: logged, no exit, no work lost or doubled', async () => {
  const f = await fleet('restart');
  const stoppedAt = Date.now();
  await server.stop('fast');
  // A restart: the server is down about a second, well within the sessions' 5 s deadline.
  await sleep(1_000);
  await server.start();
  const downFor = Date.now() - stoppedAt;
  const { recovered, carriedOn, starts, doubled } = await settle(f, 30_000);
  const logged = outageLines(f.shepherds);
  for (const n of logged) expect(n).toBeGreaterThan(0);
  // Agent starts whose finish fell into the outage were recorded once the database was back.
  const acrossOutage = starts.filter((s) => s.end !== undefined && s.end >= stoppedAt && s.end <= stoppedAt + downFor);
  expect(doubled).toEqual([]);
  const retried = f.shepherds.map((s) => s.lines(/recorded on attempt \d+, the database is back/).length);
  console.log(
    `database restart: down ${downFor} ms; work recorded again ${carriedOn} ms after it was back, all ${MACHINES} ` +
      `agents started after ${recovered} ms; ` +
      `${acrossOutage.length} agent starts ended during the outage, ${retried.reduce((a, b) => a + b, 0)} records ` +
      `retried until it was back, 0 agents started twice, 0 machines lost\n` +
      table(
        f.shepherds.map((s, i) => ({
          shepherd: s.name,
          'outage log lines': logged[i] ?? 0,
          'records retried': retried[i] ?? 0,
        })),
      ),
  );
});

test('a 30-second outage: sessions expire, no exit, every machine done once it is back; only interrupted agents start twice', async () => {
  const f = await fleet('outage');
  const stoppedAt = Date.now();
  await server.stop('fast');
  await sleep(30_000);
  for (const s of f.shepherds)
    expect(s.alive, `${s.name} exited during the outage:\n${s.stderr.slice(-3000)}`).toBe(true);
  await server.start();
  const backAt = Date.now();
  const { recovered, carriedOn, starts, doubled } = await settle(f, 60_000);
  const logged = outageLines(f.shepherds);
  for (const n of logged) expect(n).toBeGreaterThan(0);
  for (const s of f.shepherds)
    expect(s.lines(/expired: heartbeats did not reach the database/).length).toBeGreaterThan(0);

  // The agents started twice are exactly those whose first start was under way when the
  // database went away and could not be recorded: the claim went with the expired session.
  const interrupted = new Set(
    starts.filter((s) => s.begin < backAt && (s.end === undefined || s.end >= stoppedAt)).map((s) => s.machine),
  );
  for (const list of doubled) {
    expect(interrupted.has(list[0]?.machine ?? '')).toBe(true);
    expect(list).toHaveLength(2);
  }
  // Each was released with a Canceled event before it was claimed again.
  for (const list of doubled) {
    const canceled = await query<{ n: number }>(
      f.url,
      `SELECT count(*)::int AS n FROM work_history
       WHERE machine_id = $1 AND process = 'ShepherdAgentStart' AND event = 'Canceled'`,
      [list[0]?.machine],
    );
    expect(canceled[0]?.n).toBeGreaterThan(0);
  }
  console.log(
    `30 s outage: down ${backAt - stoppedAt} ms; work recorded again ${carriedOn} ms after it was back, all ` +
      `${MACHINES} agents started after ${recovered} ms; ` +
      `${interrupted.size} agent starts under way when it went down, ${doubled.length} of them started again ` +
      `(at least once, not exactly once); 0 machines lost, 0 recorded twice\n` +
      table(f.shepherds.map((s, i) => ({ shepherd: s.name, 'outage log lines': logged[i] ?? 0 }))),
  );
});
