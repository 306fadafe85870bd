/**
 * OS installation end to end on real parts: `shepherd server`, `shepherd run
 * equinix` (the fake Equinix API, its devices at a real sshd on loopback, or
 * ssh2's in-process server where none is installed), the bundled test agent
 * on every machine heartbeating under the current upstream name
 * (`cloud.agent.api.AgentCallback`), an HTTPS image server, and `shepherd
 * install` spawned as an operator would. Three machines, one requested with
 * a wrong checksum: the others installed, their disks byte-equal to the
 * image; the bad one shows its error, is requested again with the right
 * checksum and is installed; installed machines are left alone by the
 * initializer and the recoverer until a new request.
 */
import { createHash, randomBytes } from 'node:crypto';
import { readFile, truncate, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { ImageServer } from '../../../test/support/image-server.js';
import { AgentLoop } from './agent-loop.js';
import { buildOnce, eventually, shepherd } from './helpers.js';

const MACHINES = 3;
const IMAGE = randomBytes(4 << 20);
const GZIPPED = gzipSync(IMAGE);
const sha256 = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

const db = await createTestDatabase();
let loop: AgentLoop;
let images: ImageServer | undefined;

beforeAll(async () => {
  await buildOnce();
  loop = await AgentLoop.start(db, {
    name: 'install-loop',
    machines: MACHINES,
    agentEnv: (dir) => ({
      SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: '300ms',
      SHEPHERD_TEST_AGENT_LOG: `${dir}/agents.log`,
      SHEPHERD_TEST_AGENT_SERVICE: 'cloud.agent.api',
      SHEPHERD_TEST_AGENT_REBOOT_COMMAND: `echo rebooted >> ${dir}/reboots.log`,
    }),
  });
});
afterAll(async () => {
  await images?.close();
  await loop?.close();
});

/** Each machine's provider ID, agent and installation, by the database's clock. */
async function machines(): Promise<
  {
    machineId: string;
    deviceId: string;
    heartbeatAgo: number | null;
    started: boolean;
    state: string | null;
    generation: number | null;
    error: string | null;
    seconds: number | null;
  }[]
> {
  const { rows } = await db.admin(`
    SELECT p.machine_id, p.provider_id, a.machine_id IS NOT NULL AS started,
           extract(epoch FROM now() - h.agent_heartbeat_at)::float8 AS heartbeat_ago,
           q.installation_state, q.generation::int AS generation, q.installation_error,
           extract(epoch FROM q.installation_ended_at - q.requested_at)::float8 AS seconds
    FROM machine_provided p LEFT JOIN machine_agent_started a USING (machine_id)
    LEFT JOIN machine_agent_heartbeat h USING (machine_id)
    LEFT JOIN machine_os_installation_request q USING (machine_id)
    ORDER BY p.provider_id`);
  return rows.map((row) => ({
    machineId: row.machine_id,
    deviceId: row.provider_id,
    heartbeatAgo: row.heartbeat_ago,
    started: row.started,
    state: row.installation_state,
    generation: row.generation,
    error: row.installation_error,
    seconds: row.seconds,
  }));
}

test('three machines installed through their agents’ heartbeats; a wrong checksum fails visibly and is requested again', async () => {
  const server = await loop.startServer();
  // The image server's certificate is the server's: the CA every agent was given at takeover.
  images = await ImageServer.start({
    cert: await readFile(path.join(server.dir, 'server.crt'), 'utf8'),
    key: await readFile(path.join(server.dir, 'server.key'), 'utf8'),
  });
  images.serve('debian.img.gz', { bytes: GZIPPED });
  const run = loop.startRun(
    server,
    { label: 'install', devicePrefix: 'inst-' },
    { 'recoverer-first-heartbeat-timeout': '5s', 'recoverer-heartbeat-timeout': '8s' },
  );
  const diagnostics = async () =>
    [
      `shepherd run:\n${run.stderr.slice(-3000)}`,
      `shepherd server:\n${server.process.stderr.slice(-2000)}`,
      `agents:\n${(await readFile(path.join(loop.dir, 'agents.log'), 'utf8').catch(() => '')).slice(-3000)}`,
      `BMDB: ${JSON.stringify(await machines())}`,
    ].join('\n');
  const within = async <T>(what: string, check: () => Promise<T | undefined>): Promise<T> => {
    try {
      return await eventually(check, 60_000);
    } catch (error) {
      throw new Error(`${what}: ${(error as Error).message}\n${await diagnostics()}`);
    }
  };

  // Every agent heartbeats, on the cloud.agent.api name.
  const fleet = await within('every agent heartbeating', async () => {
    const now = await machines();
    return now.length === MACHINES && now.every((m) => m.heartbeatAgo !== null && m.heartbeatAgo < 2) ? now : undefined;
  });
  expect(await readFile(path.join(loop.dir, 'agents.log'), 'utf8')).toContain('(cloud.agent.api)');
  const [good1, good2, bad] = fleet as [(typeof fleet)[0], (typeof fleet)[0], (typeof fleet)[0]];
  // Each machine's disk: a file of the image's size (all three machines are this host).
  const disk = (m: { deviceId: string }) => path.join(loop.dir, `disk-${m.deviceId}`);
  for (const m of fleet) {
    await writeFile(disk(m), '');
    await truncate(disk(m), IMAGE.length);
  }
  const install = (m: { deviceId: string }, checksum: string, reason: string) =>
    shepherd(
      [
        'install',
        '--provider',
        'Equinix',
        '--provider-id',
        m.deviceId,
        '--image-url',
        images?.url('debian.img.gz') as string,
        '--image-sha256',
        checksum,
        '--root-device',
        disk(m),
        '--compression',
        'gzip',
        '--reason',
        reason,
      ],
      { SHEPHERD_BMDB_URL: db.url, DEBUG: '' },
    );
  for (const m of [good1, good2]) expect((await install(m, sha256(GZIPPED), 'first install')).code).toBe(0);
  expect((await install(bad, sha256(IMAGE), 'first install, the checksum of the unpacked image')).code).toBe(0);

  const settled = await within('every installation reported', async () => {
    const now = await machines();
    return now.every((m) => m.state === 'Succeeded' || m.state === 'Failed') ? now : undefined;
  });
  const byId = new Map(settled.map((m) => [m.deviceId, m]));
  for (const m of [good1, good2]) {
    expect(byId.get(m.deviceId)).toMatchObject({ state: 'Succeeded', started: false, heartbeatAgo: null });
    expect((await readFile(disk(m))).equals(IMAGE), m.deviceId).toBe(true);
  }
  expect(byId.get(bad.deviceId)?.state).toBe('Failed');
  expect(byId.get(bad.deviceId)?.error).toMatch(/^sha256 mismatch: downloaded [0-9a-f]{64}, want [0-9a-f]{64}$/);
  // The bad one is visible, with its error, and its agent still heartbeats.
  const status = await shepherd(['status'], { SHEPHERD_BMDB_URL: db.url });
  expect(status.stdout).toMatch(/OS installations: 3\n {2}installed +2\n {2}failed +1\n/);
  expect(status.stdout).toContain(`${bad.deviceId}  1    Failed`);
  expect(status.stdout).toMatch(/sha256 mismatch: downloaded/);
  const stillBeating = (await machines()).find((m) => m.deviceId === bad.deviceId);
  expect(stillBeating?.started).toBe(true);

  // Requested again with the right checksum: installed.
  expect((await install(bad, sha256(GZIPPED), 'again, with the right checksum')).code).toBe(0);
  const fixed = await within('the failed machine installed when asked again', async () => {
    const m = (await machines()).find((x) => x.deviceId === bad.deviceId);
    return m?.state === 'Succeeded' ? m : undefined;
  });
  expect(fixed.generation).toBe(2);
  expect((await readFile(disk(bad))).equals(IMAGE)).toBe(true);
  // The BMDB says Succeeded once the report commits; the agent reboots once its answer arrives, after.
  const reboots = await within('the third agent rebooted', async () => {
    const lines = (await readFile(path.join(loop.dir, 'reboots.log'), 'utf8')).trim().split('\n');
    return lines.length >= 3 ? lines : undefined;
  });
  expect(reboots).toHaveLength(3);
  const timings = [...settled.filter((m) => m.state === 'Succeeded'), fixed].map((m) => (m.seconds ?? 0).toFixed(2));
  console.log(
    `install loop: request to reported success ${timings.join(', ')} s (4 MiB image, gzip, heartbeats every 300 ms); load ${loadavg()[0]?.toFixed(2)}`,
  );

  // Installed machines run their OS: the initializer starts no agent on them, the recoverer reboots none,
  // while a new request on one of them makes the initializer start its agent again at once.
  const json = JSON.parse((await shepherd(['status', '--json'], { SHEPHERD_BMDB_URL: db.url })).stdout);
  expect(json.stages).toMatchObject({ installed: 3, provided: 0, heartbeating: 0, awaitingRecovery: 0 });
  expect((await install(good1, sha256(GZIPPED), 'reinstall')).code).toBe(0);
  await within('the machine asked again gets an agent, and is installed again', async () => {
    const m = (await machines()).find((x) => x.deviceId === good1.deviceId);
    return m?.state === 'Succeeded' && m.generation === 2 ? m : undefined;
  });
  const history = await db.admin(`
    SELECT p.provider_id, w.process, count(*)::int AS n FROM work_history w JOIN machine_provided p USING (machine_id)
    WHERE w.event = 'Started' GROUP BY 1, 2 ORDER BY 1, 2`);
  const starts = (deviceId: string, process: string) =>
    history.rows.find((row) => row.provider_id === deviceId && row.process === process)?.n ?? 0;
  expect(starts(good1.deviceId, 'ShepherdAgentStart')).toBe(2);
  expect(starts(good2.deviceId, 'ShepherdAgentStart')).toBe(1);
  expect(starts(bad.deviceId, 'ShepherdAgentStart')).toBe(1);
  for (const m of fleet) {
    expect(starts(m.deviceId, 'ShepherdRecovery'), m.deviceId).toBe(0);
    expect(loop.api.reboots(m.deviceId), m.deviceId).toBe(0);
  }

  for (const process of [run, server.process]) process.child.kill('SIGTERM');
  expect((await run.exited).code, run.stderr.slice(-3000)).toBe(0);
  expect((await server.process.exited).code, server.process.stderr.slice(-3000)).toBe(0);
}, 240_000);
