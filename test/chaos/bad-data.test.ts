/**
 * Scenario 6, bad data in the BMDB: a machine of a provider no shepherd here
 * knows, machines whose provider ID the provider does not know, and an agent
 * heartbeat stamped a year in the future. `shepherd run dummy` logs each
 * clearly, keeps running, and does not spin on any of them.
 */
import { beforeAll, expect, test } from 'vitest';
import { shepherd } from '../../packages/cli/test/helpers.js';
import { createTestDatabase } from '../support/database.js';
import { buildOnce, ChaosShepherd, eventually, killShepherdsAfterEach, table } from './helpers.js';

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
});
killShepherdsAfterEach();

/** A machine with a Provided tag, optionally with an agent started `startedAgo` and a heartbeat at `heartbeat`. */
async function machine(provider: string, providerId: string, agent?: { startedAgo: string; heartbeat?: string }) {
  const { rows } = await db.admin('INSERT INTO machines DEFAULT VALUES RETURNING machine_id');
  const id = rows[0].machine_id as string;
  await db.admin(
    `INSERT INTO machine_provided (machine_id, provider, provider_id, provider_status) VALUES ($1, $2, $3, 'Running')`,
    [id, provider, providerId],
  );
  if (agent) {
    await db.admin(
      `INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
       VALUES ($1, now() - $2::interval, '\\x00')`,
      [id, agent.startedAgo],
    );
    if (agent.heartbeat) {
      await db.admin(`INSERT INTO machine_agent_heartbeat VALUES ($1, now() + $2::interval)`, [id, agent.heartbeat]);
    }
  }
  return id;
}

const history = async (machineId: string) =>
  (
    await db.admin(
      'SELECT process, event, failed_cause FROM work_history WHERE machine_id = $1 ORDER BY "timestamp", event',
      [machineId],
    )
  ).rows as Array<{ process: string; event: string; failed_cause: string | null }>;

test('unknown provider, unknown provider IDs, a heartbeat from the future: logged, no crash, no spinning', async () => {
  // Two good dummy machines (slots 0 and 1), the second with its agent's heartbeat a year ahead.
  const good = await machine('Dummy', 'dummy-000000');
  const future = await machine('Dummy', 'dummy-000001', { startedAgo: '2 hours', heartbeat: '1 year' });
  // A provider this shepherd does not run: not its to touch.
  const foreign = await machine('Bogus', 'bogus-1', { startedAgo: '2 hours' });
  // Provider IDs the dummy provider does not know: one to start, one to recover.
  const unknownToStart = await machine('Dummy', 'dummy-999999');
  const unknownToRecover = await machine('Dummy', 'not-a-dummy', { startedAgo: '2 hours', heartbeat: '-1 hour' });

  const run = new ChaosShepherd(
    'bad-data',
    [
      'run',
      'dummy',
      '--bmdb-url',
      db.url,
      '--dummy-capacity',
      '4',
      '--dummy-agent-failure-rate',
      '0',
      '--dummy-heartbeat-failure-rate',
      '1',
      '--provisioner-reconciler-rate',
      '500ms,1',
      '--initializer-db-query-rate',
      '1ms,1000',
      '--recoverer-db-query-rate',
      '1ms,1000',
    ],
    {},
  );
  // The good machine's agent starts; each bad one failed once, with a cause naming it.
  await eventually(
    'the good agent started and both unknown IDs failed',
    async () => {
      const started = (await db.admin('SELECT 1 FROM machine_agent_started WHERE machine_id = $1', [good])).rowCount;
      const failed = (
        await db.admin("SELECT count(DISTINCT machine_id)::int AS n FROM work_history WHERE event = 'Failed'")
      ).rows[0].n as number;
      return started === 1 && failed >= 2 ? true : undefined;
    },
    30_000,
  );
  // Give a spinning loop time to show itself: several reconcile passes (each refuses once) and idle polls.
  const refusal = /refusing to provision; machines in the BMDB but not listed by the provider/;
  await eventually('three reconcile passes', async () => (run.lines(refusal).length >= 3 ? true : undefined), 30_000);
  expect(run.alive, run.stderr.slice(-3000)).toBe(true);

  const startHistory = await history(unknownToStart);
  expect(startHistory.map((h) => `${h.process}:${h.event}`)).toEqual([
    'ShepherdAgentStart:Started',
    'ShepherdAgentStart:Failed',
  ]);
  expect(startHistory[1]?.failed_cause).toBe('provider Dummy has no machine dummy-999999');
  const recoverHistory = await history(unknownToRecover);
  expect(recoverHistory.map((h) => `${h.process}:${h.event}`)).toEqual([
    'ShepherdRecovery:Started',
    'ShepherdRecovery:Failed',
  ]);
  expect(recoverHistory[1]?.failed_cause).toBe('provider Dummy has no machine not-a-dummy');
  // Backed off for the loops' first intervals, not retried in a loop.
  const backoffs = (
    await db.admin('SELECT machine_id, process, last_interval_seconds FROM work_backoff ORDER BY process')
  ).rows;
  expect(backoffs).toEqual([
    { machine_id: unknownToStart, process: 'ShepherdAgentStart', last_interval_seconds: 300 },
    { machine_id: unknownToRecover, process: 'ShepherdRecovery', last_interval_seconds: 60 },
  ]);
  // The provisioner refuses to act on a BMDB the provider disagrees with, naming the IDs, paced.
  const refusals = run.lines(refusal);
  expect(refusals.length).toBeGreaterThan(0);
  for (const line of refusals) expect(line).toMatch(/dummy-999999, not-a-dummy/);
  expect(refusals.length).toBeLessThan(30);
  // The other provider's machine is named at start, and left alone.
  const foreignLines = run.lines(/machines of other providers, left alone by this shepherd: Bogus 1/);
  expect(foreignLines).toHaveLength(1);
  expect(await history(foreign)).toEqual([]);
  // The heartbeat from the future is named in the log; the machine is neither rebooted nor forgotten.
  const warnings = run.lines(new RegExp(`machine ${future} .*heartbeat .* in the future`));
  expect(warnings.length).toBeGreaterThan(0);
  expect(await history(future)).toEqual([]);

  await run.stop();
  expect((await run.exited).code).toBe(0);
  console.log(
    `bad data: 1 foreign-provider machine left alone, 2 unknown provider IDs each failed once into backoff ` +
      `(300 s, 60 s), ${refusals.length} paced provisioner refusals naming them, ${warnings.length} warning(s) about ` +
      `the heartbeat from the future; no exit, no spin\n` +
      table([
        { row: 'provider Bogus', outcome: `untouched; ${(foreignLines[0] ?? '').replace(/^.*?; /, '')}` },
        { row: 'Dummy dummy-999999', outcome: startHistory[1]?.failed_cause ?? '' },
        { row: 'Dummy not-a-dummy', outcome: recoverHistory[1]?.failed_cause ?? '' },
        {
          row: 'heartbeat +1 year',
          outcome: (warnings[0] ?? '').replace(/^.*?: agent/, 'agent').replace(/ by the BMDB clock.*/, ''),
        },
      ]),
  );
});
