/**
 * Scenario 1, scale-out: three `shepherd run dummy` processes share one BMDB
 * and 200 machines. Every agent is started exactly once (by the fake agents'
 * own record, not only the BMDB's), and no machine is ever held by two
 * processes at once (the `work` table sampled throughout, and the agent
 * starts' time spans compared).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase } from '../support/database.js';
import {
  agentStarts,
  buildOnce,
  ChaosShepherd,
  dummyArgs,
  eventually,
  killShepherdsAfterEach,
  overlappingStarts,
  readAgentLog,
  table,
  WorkSampler,
} from './helpers.js';

const MACHINES = 200;
let dir: string;

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'chaos-scale-'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));
killShepherdsAfterEach();

const count = async (sql: string) => (await db.admin(sql)).rows[0].n as number;

test('three shepherds, 200 machines: every agent started exactly once, no machine held twice', async () => {
  const agentLog = path.join(dir, 'agent-starts.jsonl');
  const sampler = new WorkSampler(db.url);
  await sampler.start();
  const started = Date.now();
  // A fresh database: the three migrate it at once. Each has its own DummyProvider over the
  // same 200 slots: their provisioners race to create the same machines, their initializers
  // to claim them.
  const shepherds = ['a', 'b', 'c'].map(
    (name) =>
      new ChaosShepherd(
        name,
        dummyArgs({ url: db.url, name: `chaos-${name}`, capacity: MACHINES, agentLog, agentStartDuration: '50ms' }),
        {},
      ),
  );
  try {
    await eventually(
      'every agent started',
      async () => {
        const n = await count('SELECT count(*)::int AS n FROM machine_agent_started').catch(() => 0);
        return n === MACHINES ? true : undefined;
      },
      90_000,
    );
  } finally {
    await sampler.stop();
  }
  const elapsed = Date.now() - started;
  await Promise.all(shepherds.map((s) => s.stop()));
  for (const shepherd of shepherds) expect((await shepherd.exited).code, shepherd.stderr.slice(-3000)).toBe(0);

  // The BMDB: 200 machines, one per slot; one Finished agent start each; nothing left claimed.
  expect(await count("SELECT count(*)::int AS n FROM machine_provided WHERE provider = 'Dummy'")).toBe(MACHINES);
  expect(await count('SELECT count(DISTINCT provider_id)::int AS n FROM machine_provided')).toBe(MACHINES);
  const finished = await db.admin(`
    SELECT count(*)::int AS n FROM work_history
    WHERE process = 'ShepherdAgentStart' AND event = 'Finished' GROUP BY machine_id`);
  expect(finished.rows).toHaveLength(MACHINES);
  expect(finished.rows.every((row) => row.n === 1)).toBe(true);
  expect(await count('SELECT count(*)::int AS n FROM work')).toBe(0);
  // Each machine's history alternates claim and end: no claim while another was open.
  const interleaved = await count(`
    SELECT count(*)::int AS n FROM (
      SELECT event, lag(event) OVER (PARTITION BY machine_id, process ORDER BY "timestamp", event = 'Started') AS previous
      FROM work_history) h
    WHERE (event = 'Started') = (previous = 'Started')`);
  expect(interleaved).toBe(0);

  // The machines' own record: one agent start each, and it succeeded.
  const starts = agentStarts(readAgentLog(agentLog));
  const perMachine = new Map<string, number>();
  for (const start of starts) perMachine.set(start.machine, (perMachine.get(start.machine) ?? 0) + 1);
  expect(perMachine.size).toBe(MACHINES);
  expect([...perMachine.values()].filter((n) => n !== 1)).toEqual([]);
  expect(starts.every((start) => start.outcome === 'started')).toBe(true);
  expect(overlappingStarts(starts)).toEqual([]);

  // Never two processes on one machine, in any sample of the work table.
  expect(sampler.samples).toBeGreaterThan(20);
  expect(sampler.violations).toEqual([]);

  // All three took part.
  const byPid = new Map<number, number>();
  for (const start of starts) byPid.set(start.pid, (byPid.get(start.pid) ?? 0) + 1);
  const rows = shepherds.map((s) => ({
    shepherd: s.name,
    'agents started': byPid.get(s.pid) ?? 0,
    'creations lost to a peer': s.lines(/creating machine .* failed/).length,
  }));
  for (const row of rows) expect(row['agents started']).toBeGreaterThan(0);
  console.log(
    `scale-out: ${MACHINES} machines, 3 shepherds, all agents started in ${(elapsed / 1000).toFixed(1)} s; ` +
      `${sampler.samples} samples of the work table (up to ${sampler.maxClaims} live claims), 0 machines held twice\n${table(rows)}`,
  );
});
