/**
 * The whole loop on real parts: `shepherd server` and `shepherd run equinix`
 * (the fake Equinix API, its devices at a real sshd on loopback, or ssh2's
 * in-process server where none is installed) start the bundled test agent on
 * every machine; the agents heartbeat through the server, authenticated by
 * their own keys; the recoverer leaves them alone although their first-
 * heartbeat timeout passed long ago; the agent killed goes silent, its
 * machine is rebooted, its agent started again, and it heartbeats again.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { SshKey } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { freePort } from '../../../test/support/ports.js';
import { startTestSshServer, type TestSshServer } from '../../../test/support/sshd.js';
import {
  agentHeartbeaters,
  agentLoopFlags,
  buildOnce,
  eventually,
  killQuietly,
  runEquinixArgs,
  type Shepherd,
  shepherd,
  start,
} from './helpers.js';

const MACHINES = 3;
const TEST_AGENT = path.resolve('packages/shepherd-manager/bin/test-agent.js');
/** Heartbeats every 300 ms; silent for 8 s counts as lost (the machine is shared and may be slow). */
const HEARTBEAT_INTERVAL = '300ms';
const HEARTBEAT_TIMEOUT = '8s';

let dir: string;
let api: FakeEquinixApi;
let sshd: TestSshServer;
let keyPath: string;
const running: Shepherd[] = [];

const db = await createTestDatabase();

beforeAll(async () => {
  buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'bmaas-loop-'));
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
  keyPath = path.join(dir, 'ssh_key');
  const key = await SshKey.loadOrGenerate(keyPath);
  sshd = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
  console.log(`BMaaS loop: devices reach ${sshd.description}`);
  api = await FakeEquinixApi.start({ reservations: MACHINES, publicIpv4: '127.0.0.1', provisioningReads: 0 });
  // The agent as uploaded: sshd passes no environment on, so the wrapper sets the test agent's.
  await writeFile(
    path.join(dir, 'agent'),
    `#!/bin/sh
SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL=${HEARTBEAT_INTERVAL} SHEPHERD_TEST_AGENT_LOG=${dir}/agents.log exec ${process.execPath} ${TEST_AGENT}
`,
    { mode: 0o755 },
  );
});
afterAll(async () => {
  for (const process of running) {
    process.child.kill('SIGKILL');
    await process.exited;
  }
  for (const pid of (await heartbeaters()).values()) killQuietly(pid);
  await api?.close();
  await sshd?.stop();
  await rm(dir, { recursive: true, force: true });
});

const heartbeaters = () => agentHeartbeaters(db);

/** Per machine: its agent's key (hex), when it started and last heartbeated, by the database's clock (seconds ago). */
async function agents(): Promise<
  Map<string, { key: string; startedAgo: number; heartbeatAgo: number | null; deviceId: string }>
> {
  const { rows } = await db.admin(`
    SELECT p.machine_id, p.provider_id, encode(a.agent_public_key, 'hex') AS key,
           extract(epoch FROM now() - a.agent_started_at)::float8 AS started_ago,
           extract(epoch FROM now() - h.agent_heartbeat_at)::float8 AS heartbeat_ago
    FROM machine_provided p JOIN machine_agent_started a USING (machine_id)
    LEFT JOIN machine_agent_heartbeat h USING (machine_id)`);
  return new Map(
    rows.map((row) => [
      row.machine_id,
      { key: row.key, startedAgo: row.started_ago, heartbeatAgo: row.heartbeat_ago, deviceId: row.provider_id },
    ]),
  );
}

/** What the processes said, for a failure's message. */
async function diagnostics(run: Shepherd, server: Shepherd): Promise<string> {
  const agentsLog = await readFile(path.join(dir, 'agents.log'), 'utf8').catch(() => '(no agent log)');
  return [
    `shepherd run:\n${run.stderr.slice(-4000)}`,
    `shepherd server:\n${server.stderr.slice(-2000)}`,
    `agents:\n${agentsLog.slice(-2000)}`,
    `BMDB: ${JSON.stringify([...(await agents()).entries()])}`,
  ].join('\n');
}

test('agents heartbeat through `shepherd server`; a killed one is rebooted, started again, and heartbeats again', async () => {
  const port = await freePort();
  const serverDir = path.join(dir, 'server');
  const server = start(['server', '--bmdb-url', db.url, '--data-dir', serverDir, '--listen', `127.0.0.1:${port}`]);
  running.push(server);
  await server.logged(/BMaaS server listening/);
  const run = start(
    runEquinixArgs(
      api,
      { label: 'loop', devicePrefix: 'loop-' },
      {
        ...agentLoopFlags({ bmdbUrl: db.url, dir, keyPath, sshPort: sshd.port, serverPort: port, serverDir }),
        'recoverer-first-heartbeat-timeout': '2s',
        'recoverer-heartbeat-timeout': HEARTBEAT_TIMEOUT,
      },
    ),
    { SHEPHERD_EQUINIX_API_KEY: api.apiKey },
  );
  running.push(run);
  const within = async <T>(what: string, check: () => Promise<T | undefined>): Promise<T> => {
    try {
      return await eventually(check, 60_000);
    } catch (error) {
      throw new Error(`${what}: ${(error as Error).message}\n${await diagnostics(run, server)}`);
    }
  };

  // Every machine's agent started and heartbeats through the server.
  const first = await within('every agent heartbeating', async () => {
    const now = await agents();
    return now.size === MACHINES && [...now.values()].every((a) => a.heartbeatAgo !== null && a.heartbeatAgo < 2)
      ? now
      : undefined;
  });
  expect((await heartbeaters()).size).toBe(MACHINES);
  const reports = await db.admin('SELECT count(*)::int AS n FROM machine_hardware_report');
  expect(reports.rows[0].n).toBe(MACHINES);

  // Their starts are moved an hour back, far past the first-heartbeat timeout: heartbeats keep them alive.
  await db.admin("UPDATE machine_agent_started SET agent_started_at = agent_started_at - interval '1 hour'");

  // One agent is killed: silent, its machine rebooted, its agent started again (a new key), heartbeating again.
  const [victim, victimAgent] = [...first.entries()][0] as [string, { key: string; deviceId: string }];
  const pid = (await heartbeaters()).get(victim);
  expect(pid).toBeDefined();
  process.kill(pid as number, 'SIGKILL');
  const again = await within('the killed agent rebooted, started again and heartbeating', async () => {
    const now = (await agents()).get(victim);
    return now && now.key !== victimAgent.key && now.heartbeatAgo !== null && now.heartbeatAgo < now.startedAgo
      ? now
      : undefined;
  });
  expect(again.startedAgo).toBeLessThan(60);
  expect(api.reboots(victimAgent.deviceId)).toBe(1);

  // The others were left alone all along: no reboot, the same agent, heartbeating.
  const now = await agents();
  for (const [machineId, agent] of first) {
    if (machineId === victim) continue;
    expect(api.reboots(agent.deviceId), machineId).toBe(0);
    expect(now.get(machineId)?.key).toBe(agent.key);
    expect(now.get(machineId)?.heartbeatAgo).toBeLessThan(4);
  }
  const recoveries = await db.admin(
    "SELECT DISTINCT machine_id FROM work_history WHERE process = 'ShepherdRecovery' AND event = 'Finished'",
  );
  expect(recoveries.rows.map((row) => row.machine_id)).toEqual([victim]);
  const restarted = await heartbeaters();
  expect(restarted.size).toBe(MACHINES);
  expect(restarted.get(victim)).not.toBe(pid);

  for (const process of [run, server]) process.child.kill('SIGTERM');
  expect((await run.exited).code, run.stderr.slice(-3000)).toBe(0);
  expect((await server.exited).code, server.stderr.slice(-3000)).toBe(0);
}, 180_000);
