/**
 * The BMDB fails over: a Patroni cluster in synchronous mode
 * (test/support/patroni-cluster.ts) behind HAProxy, whose leader's Patroni
 * and PostgreSQL are SIGKILLed, as a crashed machine is, under whole shepherd
 * processes. Twice: during a burst of claims (two `shepherd run dummy` of 8
 * workers, `shepherd web` and the fleet gauges, an operator's hold and
 * `shepherd power` actions racing the kill), and during agents' heartbeats
 * through `shepherd server` (`shepherd run equinix` with real test agents
 * reporting on OS installations requested up to the kill). No process is
 * restarted.
 *
 * The promises are checked against the BMDB and the agents' own records:
 * every row a reader saw committed on the old primary is on the new one,
 * no machine is held by two processes at once, no agent whose start was
 * recorded is started again, every machine is started, and claims and
 * heartbeats are recorded again within 45 s of the kill (Patroni's ttl of
 * 30 s, its loop and HAProxy's checks).
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { AgentLoop } from '../../packages/cli/test/agent-loop.js';
import { shepherd } from '../../packages/cli/test/helpers.js';
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
} from '../chaos/helpers.js';
import type { TestDatabase } from '../support/database.js';
import { PatroniCluster, patroniClusterUnavailable } from '../support/patroni-cluster.js';
import { freePort } from '../support/ports.js';
import { CommittedRecorder, type CommittedRows, lostRows, readCommitted } from './committed.js';

/** Claims must be recorded again this soon after the kill: Patroni's ttl of 30 s, plus its loop and HAProxy's check. */
const RESUME_WITHIN = 45_000;
const MACHINES = 800;
const AGENT_START = '1s';
const AGENTS = 4;

const unavailable = patroniClusterUnavailable();
if (unavailable) {
  console.log(`failover tests skipped: ${unavailable} (Debian packages postgresql-15, patroni, etcd-server, haproxy)`);
}
let cluster: PatroniCluster;
let dir: string;

beforeAll(async () => {
  if (unavailable) return;
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'bmdb-ha-test-'));
  cluster = await PatroniCluster.start({ synchronous: true });
});
afterAll(async () => {
  await cluster?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});
killShepherdsAfterEach();

/** A TestDatabase over the cluster, for the CLI's test helpers. */
function clusterDatabase(name: string, url: string): TestDatabase {
  return {
    name,
    url,
    admin: async (text, values) => {
      const client = new pg.Client({ connectionString: url });
      client.on('error', () => {});
      await client.connect();
      try {
        return await client.query(text, values);
      } finally {
        await client.end().catch(() => {});
      }
    },
  };
}

/** The committed rows as the (new) primary has them. */
async function readOnPrimary(url: string) {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => {});
  await client.connect();
  try {
    return await readCommitted(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/** Waits as `eventually` does; on a timeout, the error carries what the processes and the cluster said. */
async function within<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeout: number,
  processes: readonly { name: string; stderr: string }[],
): Promise<T> {
  try {
    return await eventually(what, check, timeout, 200);
  } catch (error) {
    const events = (text: string) =>
      text
        .split('\n')
        .filter((line) => !line.includes(':detail '))
        .slice(-60)
        .join('\n');
    const logs = processes.map((p) => `--- ${p.name}\n${events(p.stderr)}`).join('\n');
    const members = JSON.stringify(await cluster.members());
    throw new Error(`${(error as Error).message}\nmembers: ${members}\n${logs}\n${await cluster.logs()}`);
  }
}

/** Polls `url` until it answers 200; the time it did. */
async function servesAgain(what: string, url: string, timeout: number): Promise<number> {
  return eventually(
    what,
    async () => {
      try {
        const response = await fetch(url, { signal: AbortSignal.timeout(5_000) });
        await response.arrayBuffer();
        return response.ok ? Date.now() : undefined;
      } catch {
        return undefined;
      }
    },
    timeout,
    250,
  );
}

/** A metric's value in a Prometheus text exposition (the sum over its series), or undefined. */
function metric(text: string, name: string): number | undefined {
  const values = text
    .split('\n')
    .filter((line) => line.startsWith(`${name} `) || line.startsWith(`${name}{`))
    .map((line) => Number(line.slice(line.lastIndexOf(' ') + 1)));
  return values.length === 0 ? undefined : values.reduce((a, b) => a + b, 0);
}

async function scrape(port: number): Promise<string> {
  try {
    const response = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(5_000) });
    return await response.text();
  } catch {
    return '';
  }
}

test.skipIf(unavailable)(
  'the primary killed during a burst of claims: claims resume within 45 s, nothing committed lost, no machine worked twice at once, page and gauges back, no process restarted',
  async () => {
    const url = await cluster.createDatabase('claims');
    expect((await shepherd(['migrate', '--bmdb-url', url])).code).toBe(0);
    const agentLog = path.join(dir, 'claims-agents.jsonl');
    const metricsPorts = [await freePort(), await freePort()];
    const runs = ['a', 'b'].map(
      (name, i) =>
        new ChaosShepherd(
          name,
          dummyArgs({
            url,
            name: `ha-${name}`,
            capacity: MACHINES,
            agentLog,
            agentStartDuration: AGENT_START,
            parallelism: 8,
            extra: ['--metrics-listen', `127.0.0.1:${metricsPorts[i]}`, '--fleet-metrics-interval', '3s'],
          }),
          {},
        ),
    );
    const webPort = await freePort();
    const web = new ChaosShepherd('web', ['web', '--bmdb-url', url, '--web-listen', `127.0.0.1:${webPort}`], {});
    const processes = [...runs, web];
    const started = () =>
      cluster
        .query<{ n: number }>('claims', 'SELECT count(*)::int AS n FROM machine_agent_started')
        .then((r) => r[0]?.n ?? 0);
    const sampler = new WorkSampler(url);
    await sampler.start();
    await eventually('an agent started', async () => ((await started()) >= 1 ? true : undefined), 120_000);
    await servesAgain('the fleet page', `http://127.0.0.1:${webPort}/`, 30_000);
    const readings = async () =>
      Math.max(
        ...(await Promise.all(metricsPorts.map(scrape))).map(
          (t) => metric(t, 'bmdb_fleet_reading_duration_seconds_count') ?? 0,
        ),
      );
    const readingsBefore = await eventually(
      'the fleet gauges read',
      async () => {
        const n = await readings();
        return n > 0 ? n : undefined;
      },
      30_000,
    );

    // An operator's hold of a started machine, committed before the kill.
    const [held] = await cluster.query<{ machine_id: string }>(
      'claims',
      'SELECT machine_id FROM machine_agent_started LIMIT 1',
    );
    // Power actions on started machines (the dummy's power is simulated in the CLI's own process): one
    // awaited, and four more started with it and the hold, the kill raced against them; each recorded in the
    // operator history.
    const powered = await cluster.query<{ provider_id: string }>(
      'claims',
      `SELECT p.provider_id FROM machine_agent_started JOIN machine_provided p USING (machine_id)
       WHERE machine_id <> $1 ORDER BY p.provider_id LIMIT 5`,
      [held?.machine_id],
    );
    const powerCycle = (ids: readonly string[], command: 'cycle' | 'on') =>
      shepherd([
        'power',
        command,
        '--bmdb-url',
        url,
        '--provider',
        'Dummy',
        '--dummy-capacity',
        String(MACHINES),
        '--provider-id',
        ...ids,
        '--reason',
        'failover test',
        '--actor',
        'ha',
      ]);
    const racing = powered.slice(1).map((m, i) => powerCycle([m.provider_id], i % 2 === 0 ? 'cycle' : 'on'));
    const [hold, firstPower] = await Promise.all([
      shepherd([
        'hold',
        '--bmdb-url',
        url,
        '--machine-id',
        held?.machine_id ?? '',
        '--reason',
        'failover test',
        '--actor',
        'ha',
      ]),
      powerCycle([powered[0]?.provider_id ?? ''], 'cycle'),
    ]);
    expect(hold.code, hold.stderr).toBe(0);
    expect(firstPower.code, firstPower.stderr).toBe(0);

    const recorder = new CommittedRecorder(url);
    await recorder.start();
    await eventually('the committed rows read', async () => recorder.last, 30_000);
    const powerRecordsIn = (rows: CommittedRows) =>
      [...rows.operatorHistory].filter((key) => / Power(Cycle|On) /.test(key));
    // Killed as soon as a raced action is committed, the others (those not done already) still under way.
    await eventually(
      'a raced power action recorded',
      async () => (recorder.last && powerRecordsIn(recorder.last).length > 1 ? true : undefined),
      60_000,
      10,
    );
    const kill = await cluster.killLeader();
    const before = await recorder.stop();
    // Those the kill cut off exit 1 naming the machine; those it did not are recorded.
    await Promise.all(racing);
    const powerRecords = powerRecordsIn(before);
    const startedBefore = before.agentStarted.size;
    // The kill fell into the burst: most machines were still to be claimed.
    expect(startedBefore).toBeLessThan(MACHINES / 2);

    // Claims resume: a Started written after the kill, on the new primary.
    const firstClaim = await within(
      'a claim recorded on the new primary',
      async () => {
        try {
          const [row] = await cluster.query<{ n: number }>(
            'claims',
            `SELECT count(*)::int AS n FROM work_history WHERE event = 'Started' AND "timestamp" > $1`,
            [new Date(kill.at)],
          );
          return (row?.n ?? 0) > 0 ? Date.now() : undefined;
        } catch {
          return undefined;
        }
      },
      RESUME_WITHIN - (Date.now() - kill.at),
      processes,
    );
    const newLeader = await cluster.waitForLeader({ not: kill.name });
    const pageBack = await servesAgain(
      'the fleet page after the failover',
      `http://127.0.0.1:${webPort}/`,
      RESUME_WITHIN,
    );
    const gaugesBack = await eventually(
      'the fleet gauges read again',
      async () => {
        const texts = await Promise.all(metricsPorts.map(scrape));
        const up = texts.every((t) => metric(t, 'bmdb_up') === 1);
        const readings = Math.max(...texts.map((t) => metric(t, 'bmdb_fleet_reading_duration_seconds_count') ?? 0));
        return up && readings > readingsBefore ? Date.now() : undefined;
      },
      RESUME_WITHIN,
      250,
    );
    await eventually('every agent started', async () => ((await started()) === MACHINES ? true : undefined), 180_000);
    await sampler.stop();

    for (const p of processes) expect(p.alive, `${p.name} exited:\n${p.stderr.slice(-3000)}`).toBe(true);
    const after = await readOnPrimary(url);
    expect(lostRows(before, after)).toEqual({
      history: [],
      agentStarted: [],
      holds: [],
      operatorHistory: [],
      installationReports: [],
      installationRequests: [],
      heartbeats: [],
    });
    expect(before.holds.size).toBe(1);
    expect(powerRecords.length).toBeGreaterThanOrEqual(2);
    expect(sampler.violations).toEqual([]);
    const starts = agentStarts(readAgentLog(agentLog));
    expect(overlappingStarts(starts)).toEqual([]);
    const perMachine = new Map<string, number>();
    for (const s of starts) perMachine.set(s.machine, (perMachine.get(s.machine) ?? 0) + 1);
    // No agent whose start was recorded before the kill was started again.
    const startedTwice = [...perMachine].filter(([, n]) => n > 1).map(([machine]) => machine);
    expect(startedTwice.filter((machine) => before.agentStarted.has(machine))).toEqual([]);
    const failoverLines = runs.map(
      (r) => r.lines(/fail(ed)? ?over|the BMDB is unreachable|connection was lost/i).length,
    );
    for (const n of failoverLines) expect(n).toBeGreaterThan(0);

    await Promise.all(processes.map((p) => p.stop()));
    for (const p of processes) expect((await p.exited).code, p.name).toBe(0);
    console.log(
      `failover during claims (synchronous): leader ${kill.name} killed with ${startedBefore} of ${MACHINES} agents ` +
        `started; new leader ${newLeader}; claims recorded again ${firstClaim - kill.at} ms after the kill, the page ` +
        `${pageBack - kill.at} ms, the fleet gauges ${gaugesBack - kill.at} ms; ${startedTwice.length} agent starts ` +
        `redone (their sessions expired with the start under way), 0 of them recorded before the kill; ` +
        `${before.history.size} history rows committed before the kill, 0 lost; ${powerRecords.length} power actions ` +
        `recorded before it (1 awaited, ${powered.length - 1} raced by the kill), 0 lost\n` +
        table(runs.map((r, i) => ({ shepherd: r.name, 'failover log lines': failoverLines[i] ?? 0 }))),
    );
  },
);

test.skipIf(unavailable)(
  'the primary killed during agents’ heartbeats: `shepherd server` answers UNAVAILABLE meanwhile, never UNAUTHENTICATED, and records them again within 45 s',
  async () => {
    const url = await cluster.createDatabase('heartbeats');
    const db = clusterDatabase('heartbeats', url);
    const loop = await AgentLoop.start(db, {
      name: 'ha-heartbeats',
      machines: AGENTS,
      agentEnv: (loopDir) => ({
        SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: '300ms',
        SHEPHERD_TEST_AGENT_LOG: `${loopDir}/agents.log`,
      }),
    });
    try {
      const server = await loop.startServer();
      const run = loop.startRun(server, { label: 'ha', devicePrefix: 'ha-' }, {});
      const heartbeating = async () => {
        const rows = await cluster.query<{ n: number }>(
          'heartbeats',
          `SELECT count(*)::int AS n FROM machine_agent_heartbeat WHERE agent_heartbeat_at > now() - interval '2 seconds'`,
        );
        return rows[0]?.n ?? 0;
      };
      await eventually(
        'every agent heartbeating',
        async () => ((await heartbeating()) === AGENTS ? true : undefined),
        120_000,
      );
      // The cluster's synchronous standby after the first test's failover, before this kill.
      await cluster.waitForLeader();

      // OS installations the agents report on in their heartbeats: an image no server serves, so each
      // agent reports its installation failed and goes on heartbeating. Two reported before the kill,
      // two requested just before it, their reports racing it.
      const devices = (
        await cluster.query<{ provider_id: string }>(
          'heartbeats',
          'SELECT provider_id FROM machine_provided ORDER BY provider_id',
        )
      ).map((r) => r.provider_id);
      const imageUrl = `http://127.0.0.1:${await freePort()}/no-such.img`;
      const install = (ids: readonly string[]) =>
        shepherd(
          [
            'install',
            '--provider',
            'Equinix',
            '--provider-id',
            ...ids,
            '--image-url',
            imageUrl,
            '--image-sha256',
            '0'.repeat(64),
            '--root-device',
            path.join(loop.dir, 'no-disk'),
            '--reason',
            'failover test',
          ],
          { SHEPHERD_BMDB_URL: url, DEBUG: '' },
        );
      const reports = async () =>
        (
          await cluster.query<{ n: number }>(
            'heartbeats',
            'SELECT count(*)::int AS n FROM machine_os_installation_report',
          )
        )[0]?.n ?? 0;
      const firstInstalls = await install(devices.slice(0, 2));
      expect(firstInstalls.code, firstInstalls.stderr).toBe(0);
      await eventually('two installations reported', async () => ((await reports()) >= 2 ? true : undefined), 60_000);
      const lateInstalls = await install(devices.slice(2));
      expect(lateInstalls.code, lateInstalls.stderr).toBe(0);

      const recorder = new CommittedRecorder(url);
      await recorder.start();
      // Killed as soon as a late installation's report is committed, the other's still to come.
      await eventually(
        'a late installation reported',
        async () => ((recorder.last?.installationReports.size ?? 0) > 2 ? true : undefined),
        60_000,
        10,
      );
      const kill = await cluster.killLeader();
      const before = await recorder.stop();
      expect(before.installationRequests.size).toBe(AGENTS);
      expect(before.installationReports.size).toBeGreaterThanOrEqual(3);

      const recorded = await within(
        'a heartbeat recorded on the new primary',
        async () => {
          try {
            const [row] = await cluster.query<{ n: number }>(
              'heartbeats',
              'SELECT count(*)::int AS n FROM machine_agent_heartbeat WHERE agent_heartbeat_at > $1',
              [new Date(kill.at)],
            );
            return (row?.n ?? 0) > 0 ? Date.now() : undefined;
          } catch {
            return undefined;
          }
        },
        RESUME_WITHIN - (Date.now() - kill.at),
        [
          {
            name: 'server',
            get stderr() {
              return server.process.stderr;
            },
          },
          {
            name: 'run',
            get stderr() {
              return run.stderr;
            },
          },
        ],
      );
      const newLeader = await cluster.waitForLeader({ not: kill.name });
      await eventually(
        'every agent heartbeating again',
        async () => ((await heartbeating()) === AGENTS ? true : undefined),
        60_000,
      );

      for (const p of [server.process, run]) expect(p.child.exitCode, p.stderr.slice(-3000)).toBeNull();
      const after = await readOnPrimary(url);
      expect(lostRows(before, after)).toEqual({
        history: [],
        agentStarted: [],
        holds: [],
        operatorHistory: [],
        installationReports: [],
        installationRequests: [],
        heartbeats: [],
      });
      // What the agents were answered while the primary was gone: retryable, never UNAUTHENTICATED (16).
      const agentsLog = await readFile(path.join(loop.dir, 'agents.log'), 'utf8');
      const failures = agentsLog.split('\n').filter((line) => line.includes('heartbeat failed'));
      expect(failures.length).toBeGreaterThan(0);
      expect(failures.filter((line) => /gRPC status 16\b/.test(line))).toEqual([]);
      const unavailableAnswers = failures.filter((line) => /gRPC status 14\b/.test(line)).length;
      // Each agent started once: none started again because its AgentStarted was lost.
      const starts = await cluster.query<{ n: number }>(
        'heartbeats',
        `SELECT count(*)::int AS n FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Finished'
         GROUP BY machine_id`,
      );
      expect(starts.map((r) => r.n)).toEqual(Array(AGENTS).fill(1));
      console.log(
        `failover during heartbeats (synchronous): leader ${kill.name} killed; new leader ${newLeader}; a heartbeat ` +
          `recorded again ${recorded - kill.at} ms after the kill; ${failures.length} heartbeats failed meanwhile ` +
          `(${unavailableAnswers} answered UNAVAILABLE, the rest cut connections), 0 UNAUTHENTICATED; ` +
          `${before.installationReports.size} of ${AGENTS} installation reports committed before the kill ` +
          `(the kill raced the last), 0 lost; no process restarted`,
      );
    } finally {
      await loop.close();
    }
  },
);
