/**
 * Scenario 4, hostile agents and network: `shepherd run equinix` against the
 * fake Equinix API, its devices reachable over SSH at a real sshd (through a
 * proxy that can cut connections or go silent), with an agent executable
 * that hangs, prints garbage, prints a flood, exits non-zero, or behaves, as
 * the test says. Every machine ends in backoff with a cause naming what
 * happened; the process keeps serving and claiming, and its memory and file
 * descriptors stay bounded over many hostile rounds.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { SshKey } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { runEquinixArgs, shepherd } from '../../packages/cli/test/helpers.js';
import { createTestDatabase } from '../support/database.js';
import { HostileProxy } from '../support/hostile-proxy.js';
import { freePort } from '../support/ports.js';
import { startTestSshServer, type TestSshServer } from '../support/sshd.js';
import { buildOnce, ChaosShepherd, eventually, killShepherdsAfterEach, TEST_AGENT, table } from './helpers.js';

const MACHINES = 4;
// Bounds, not waits (only the hanging agent and the silent server run into them): wide enough
// for four 2 MiB uploads at once through ssh2's in-process server on a loaded machine.
const EXEC_TIMEOUT = 8_000;
const CONNECT_TIMEOUT = 3_000;
/** The agent executable is this big, so an upload can be cut half way. */
const AGENT_SIZE = 2 * 1024 * 1024;

let dir: string;
let api: FakeEquinixApi;
let sshd: TestSshServer;
let proxy: HostileProxy;
let keyPath: string;

/** What the agent does, read by the agent from a file on the "machine" at every start. */
type AgentMode = 'hang' | 'garbage' | 'flood' | 'exit-3' | 'behave';

const db = await createTestDatabase();

beforeAll(async () => {
  await buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'chaos-agent-'));
  expect((await shepherd(['migrate', '--bmdb-url', db.url])).code).toBe(0);
  keyPath = path.join(dir, 'ssh_key');
  const key = await SshKey.loadOrGenerate(keyPath);
  sshd = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
  proxy = await HostileProxy.start(sshd.port);
  api = await FakeEquinixApi.start({ reservations: MACHINES, publicIpv4: '127.0.0.1', provisioningReads: 0 });
  await writeFile(path.join(dir, 'agent'), agentScript(), { mode: 0o755 });
});
afterAll(async () => {
  await api?.close();
  await proxy?.close();
  await sshd?.stop();
  killAgents();
  await rm(dir, { recursive: true, force: true });
});
killShepherdsAfterEach();

/** A shell script standing in for the agent; padded after its `exit` to AGENT_SIZE. */
function agentScript(): string {
  const script = `#!/bin/sh
# The chaos tests' hostile agent: what it does is in ${dir}/mode.
case "$(cat ${dir}/mode)" in
  hang) echo $$ >> ${dir}/hung-agents; exec sleep 600 ;;
  garbage) cat > /dev/null; printf 'HTTP/1.1 500 Internal Server Error\\r\\n\\r\\n<html>oops</html>\\n'; exit 0 ;;
  flood) cat > /dev/null; exec head -c 1073741824 /dev/zero ;;
  exit-3) cat > /dev/null; echo 'agent: cannot open /dev/tpm0: No such device' >&2; exit 3 ;;
  behave) exec ${process.execPath} ${TEST_AGENT} ;;
esac
exit 99
`;
  return script + `# ${'x'.repeat(78)}\n`.repeat(Math.ceil((AGENT_SIZE - script.length) / 81));
}

/** Kills the hung agents left on the "machines": as root, the SSH server does not pass the shepherd's kill on. */
function killAgents(): void {
  let pids: string[] = [];
  try {
    pids = readFileSync(path.join(dir, 'hung-agents'), 'utf8').split('\n').filter(Boolean);
  } catch {}
  for (const pid of pids) {
    try {
      // Only if it still is our sleeping agent, not a process that got its PID since.
      if (readFileSync(`/proc/${pid}/cmdline`, 'utf8') === 'sleep\u0000600\u0000') process.kill(Number(pid), 'SIGKILL');
    } catch {}
  }
}

async function setMode(mode: AgentMode): Promise<void> {
  await writeFile(path.join(dir, 'mode'), `${mode}\n`);
}

const failures = async () =>
  (
    await db.admin(
      "SELECT count(*)::int AS n FROM work_history WHERE process = 'ShepherdAgentStart' AND event = 'Failed'",
    )
  ).rows[0].n as number;

/**
 * One hostile round: every machine's backoff is moved into the past, and the
 * round ends once each machine failed again; returns the causes.
 */
async function round(): Promise<string[]> {
  const before = await failures();
  await db.admin("UPDATE work_backoff SET until = now() - interval '1 second' WHERE process = 'ShepherdAgentStart'");
  await eventually(
    'every machine failed again',
    async () => ((await failures()) >= before + MACHINES ? true : undefined),
    30_000,
  );
  const { rows } = await db.admin(
    "SELECT machine_id, cause FROM work_backoff WHERE process = 'ShepherdAgentStart' AND until > now() ORDER BY 1",
  );
  return rows.map((row) => row.cause as string);
}

const fds = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

test('hanging, garbage-printing, flooding, failing agents, cut uploads and silent SSH servers: each named in the backoff; the shepherd stays healthy', async () => {
  console.log(`hostile agents: devices reach ${sshd.description} through a hostile proxy`);
  await setMode('hang');
  const metricsPort = await freePort();
  const run = new ChaosShepherd(
    'equinix',
    runEquinixArgs(
      api,
      { label: 'chaos', devicePrefix: 'chaos-' },
      {
        'bmdb-url': db.url,
        'ssh-key-path': keyPath,
        'agent-executable-path': path.join(dir, 'agent'),
        'agent-target-path': path.join(dir, 'agent-on-machine'),
        'agent-endpoint': 'bmaas.example.com:443',
        'agent-ssh-port': String(proxy.port),
        'agent-ssh-connect-timeout': `${CONNECT_TIMEOUT}ms`,
        'agent-ssh-exec-timeout': `${EXEC_TIMEOUT}ms`,
        'provisioner-device-creation-rate': '1ms,100',
        'initializer-loop-parallelism': String(MACHINES),
        'initializer-db-query-rate': '1ms,1000',
        'metrics-listen': `127.0.0.1:${metricsPort}`,
      },
    ),
    { SHEPHERD_EQUINIX_API_KEY: api.apiKey },
  );
  const observed: Array<Record<string, string | number>> = [];
  const check = async (what: string, causes: string[], expected: RegExp) => {
    expect(causes, `${what}:\n${run.stderr.slice(-3000)}`).toHaveLength(MACHINES);
    for (const cause of causes) expect(cause, what).toMatch(expected);
    expect(run.alive).toBe(true);
    // The cause, without the machine and address every SSH cause starts with.
    const cause = (causes[0] ?? '').replace(/^(SSH to )?(agent on )?machine [0-9a-f-]{36}( at [\d.:]+)?:? ?/, '');
    observed.push({ fault: what, 'machines failed': causes.length, cause: cause.replaceAll(dir, '…') });
  };

  // The machines come in hanging: the exec timeout ends each start.
  await eventually(
    'every machine failed once',
    async () => ((await failures()) >= MACHINES ? true : undefined),
    30_000,
  );
  const first = (await db.admin("SELECT cause FROM work_backoff WHERE process = 'ShepherdAgentStart'")).rows.map(
    (row) => row.cause as string,
  );
  await check('agent hangs', first, new RegExp(`exec timeout of ${EXEC_TIMEOUT} ms \\(upload and run\\) passed`));

  await setMode('garbage');
  await check('agent prints garbage', await round(), /standard output \(\d+ bytes\) is not a TakeoverResponse/);
  await setMode('exit-3');
  await check('agent exits 3', await round(), /exited with status 3: agent: cannot open \/dev\/tpm0: No such device/);

  await setMode('behave');
  proxy.mode = { kind: 'cut', bytes: 256 * 1024 };
  await check(
    'connection cut mid-upload',
    await round(),
    /upload to .*agent-on-machine: the connection was lost before the upload completed/,
  );
  proxy.mode = { kind: 'silent' };
  await check(
    'SSH server silent',
    await round(),
    new RegExp(`not ready within the connect timeout of ${CONNECT_TIMEOUT} ms`),
  );
  proxy.mode = { kind: 'pass' };

  // Floods, over and over: output is capped, memory and descriptors stay bounded.
  await setMode('flood');
  await check('agent floods stdout', await round(), /wrote more than 1048576 bytes to stdout; killed/);
  const rssBefore = run.rssKiB();
  const fdsBefore = fds(run.pid);
  const ROUNDS = 8;
  for (let i = 0; i < ROUNDS; i++) {
    const causes = await round();
    for (const cause of causes) expect(cause).toMatch(/wrote more than 1048576 bytes to stdout; killed/);
  }
  const rssAfter = run.rssKiB();
  const fdsAfter = fds(run.pid);
  // Each flood is cut at 1 MiB: without the cap, every round would hold up to 4 × 1 GiB.
  expect(rssAfter - rssBefore).toBeLessThan(64 * 1024);
  expect(fdsAfter - fdsBefore).toBeLessThan(8);

  // Still serving, still claiming: well-behaved agents start.
  const metrics = await fetch(`http://127.0.0.1:${metricsPort}/metrics`);
  expect(metrics.status).toBe(200);
  expect(await metrics.text()).toMatch(/bmdb_work_finished_total\{[^}]*result="failed"\} \d+/);
  await setMode('behave');
  await db.admin("UPDATE work_backoff SET until = now() - interval '1 second'");
  await eventually(
    'every agent started',
    async () =>
      (await db.admin('SELECT count(*)::int AS n FROM machine_agent_started')).rows[0].n === MACHINES
        ? true
        : undefined,
    30_000,
  );
  await run.stop();
  expect((await run.exited).code).toBe(0);
  expect((await db.admin('SELECT count(*)::int AS n FROM work')).rows[0].n).toBe(0);
  console.log(
    `hostile agents: ${MACHINES} machines through ${observed.length} kinds of fault, then ${ROUNDS} more flood rounds ` +
      `(${ROUNDS * MACHINES} floods of 1 GiB, cut at 1 MiB): RSS ${Math.round(rssBefore / 1024)} → ` +
      `${Math.round(rssAfter / 1024)} MiB, fds ${fdsBefore} → ${fdsAfter}; proxy cut ${proxy.cuts} uploads, held ` +
      `${proxy.silenced} connections silent; then all ${MACHINES} agents started\n${table(observed)}`,
  );
}, 180_000);
