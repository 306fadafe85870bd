/**
 * The whole loop on real parts: `shepherd server` and `shepherd run equinix`
 * (the fake Equinix API, its devices at a real sshd on loopback, or ssh2's
 * in-process server where none is installed) start the bundled test agent on
 * every machine; the agents heartbeat through the server, authenticated by
 * their own keys; the recoverer leaves them alone although their first-
 * heartbeat timeout passed long ago; the agent killed goes silent, its
 * machine is rebooted, its agent started again, and it heartbeats again.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { startedAgents } from '../../../test/support/agents.js';
import { createTestDatabase } from '../../../test/support/database.js';
import { AgentLoop } from './agent-loop.js';
import { buildOnce, eventually, type Shepherd } from './helpers.js';

const MACHINES = 3;
/** Heartbeats every 300 ms; silent for 8 s counts as lost (the machine is shared and may be slow). */
const HEARTBEAT_INTERVAL = '300ms';
const HEARTBEAT_TIMEOUT = '8s';

const db = await createTestDatabase();
let loop: AgentLoop;

beforeAll(async () => {
  await buildOnce();
  loop = await AgentLoop.start(db, {
    name: 'bmaas-loop',
    machines: MACHINES,
    agentEnv: (dir) => ({
      SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: HEARTBEAT_INTERVAL,
      SHEPHERD_TEST_AGENT_LOG: `${dir}/agents.log`,
    }),
  });
});
afterAll(() => loop?.close());

/** Per machine ID: its started agent. */
const agents = () => startedAgents(db, 'machineId');

/** What the processes said, for a failure's message. */
async function diagnostics(run: Shepherd, server: Shepherd): Promise<string> {
  const agentsLog = await readFile(path.join(loop.dir, 'agents.log'), 'utf8').catch(() => '(no agent log)');
  return [
    `shepherd run:\n${run.stderr.slice(-4000)}`,
    `shepherd server:\n${server.stderr.slice(-2000)}`,
    `agents:\n${agentsLog.slice(-2000)}`,
    `BMDB: ${JSON.stringify([...(await agents()).entries()])}`,
  ].join('\n');
}

test('agents heartbeat through `shepherd server`; a killed one is rebooted, started again, and heartbeats again', async () => {
  const server = await loop.startServer();
  const run = loop.startRun(
    server,
    { label: 'loop', devicePrefix: 'loop-' },
    { 'recoverer-first-heartbeat-timeout': '2s', 'recoverer-heartbeat-timeout': HEARTBEAT_TIMEOUT },
  );
  const within = async <T>(what: string, check: () => Promise<T | undefined>): Promise<T> => {
    try {
      return await eventually(check, 60_000);
    } catch (error) {
      throw new Error(`${what}: ${(error as Error).message}\n${await diagnostics(run, server.process)}`);
    }
  };

  // Every machine's agent started and heartbeats through the server.
  const first = await within('every agent heartbeating', async () => {
    const now = await agents();
    return now.size === MACHINES && [...now.values()].every((a) => a.heartbeatAgo !== null && a.heartbeatAgo < 2)
      ? now
      : undefined;
  });
  expect((await loop.heartbeaters()).size).toBe(MACHINES);
  const reports = await db.admin('SELECT count(*)::int AS n FROM machine_hardware_report');
  expect(reports.rows[0].n).toBe(MACHINES);

  // Their starts are moved an hour back, far past the first-heartbeat timeout: heartbeats keep them alive.
  await db.admin("UPDATE machine_agent_started SET agent_started_at = agent_started_at - interval '1 hour'");

  // One agent is killed: silent, its machine rebooted, its agent started again (a new key), heartbeating again.
  const [victim, victimAgent] = [...first.entries()][0] as [string, { key: string; providerId: string }];
  const pid = (await loop.heartbeaters()).get(victim);
  expect(pid).toBeDefined();
  process.kill(pid as number, 'SIGKILL');
  const again = await within('the killed agent rebooted, started again and heartbeating', async () => {
    const now = (await agents()).get(victim);
    return now && now.key !== victimAgent.key && now.heartbeatAgo !== null && now.heartbeatAgo < now.startedAgo
      ? now
      : undefined;
  });
  expect(again.startedAgo).toBeLessThan(60);
  expect(loop.api.reboots(victimAgent.providerId)).toBe(1);

  // The others were left alone all along: no reboot, the same agent, heartbeating.
  const now = await agents();
  for (const [machineId, agent] of first) {
    if (machineId === victim) continue;
    expect(loop.api.reboots(agent.providerId), machineId).toBe(0);
    expect(now.get(machineId)?.key).toBe(agent.key);
    expect(now.get(machineId)?.heartbeatAgo).toBeLessThan(4);
  }
  const recoveries = await db.admin(
    "SELECT DISTINCT machine_id FROM work_history WHERE process = 'ShepherdRecovery' AND event = 'Finished'",
  );
  expect(recoveries.rows.map((row) => row.machine_id)).toEqual([victim]);
  const restarted = await loop.heartbeaters();
  expect(restarted.size).toBe(MACHINES);
  expect(restarted.get(victim)).not.toBe(pid);

  for (const process of [run, server.process]) process.child.kill('SIGTERM');
  expect((await run.exited).code, run.stderr.slice(-3000)).toBe(0);
  expect((await server.process.exited).code, server.process.stderr.slice(-3000)).toBe(0);
}, 180_000);
