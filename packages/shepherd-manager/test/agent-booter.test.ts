/**
 * The agent booter with its real parts around it: a real BMDB, the real
 * BMaaS server over TLS, the real boot files, and the real agent. The BMC is
 * a fake that does what a machine booted from virtual media does: it fetches
 * the boot's ISO from the URL it was given, takes the config initramfs out
 * of it (xorriso, busybox cpio: as the kernel unpacks it) and starts
 * `bmaas-agent enroll` with it, which makes its key, enrolls with the token
 * and heartbeats. A BMC that boots nothing, and one that refuses, fail the
 * work with the cause, and the boot's files are gone either way.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  addProvided,
  agentEnrollment,
  deleteAgentHeartbeat,
  deleteAgentStarted,
  newMachine,
  Process,
  requestOSInstallation,
  setAgentBootMethods,
  setAgentHeartbeat,
  setAgentStarted,
} from '@bmaas/bmdb-controlloop';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { smallAgentImage } from '../../../test/support/agent-image.js';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import {
  type AgentBootControl,
  AgentBootError,
  AgentBooter,
  AgentBootFiles,
  type AgentBootMedia,
  type AgentBootStarted,
  AgentEnrollmentTimeoutError,
  Availability,
  type Machine,
  MachineNotFoundError,
  NotImplementedError,
  type Provider,
} from '../src/index.js';

const run = promisify(execFile);
const PROVIDER = 'BootTest';
const agentBin = fileURLToPath(new URL('../../agent/bin/agent.js', import.meta.url));

const { bmdb } = await testBMDB();
const q = bmdb.db;

/** How the fake BMC answers a machine's agent boot. */
type Behaviour = 'boots' | 'boots-nothing' | 'refuses';

/** What the fake BMC was told, in order, per provider ID. */
type Told = { readonly act: 'boot'; readonly isoUrl: string } | { readonly act: 'end' };

/**
 * A provider whose machines' BMCs boot the agent from virtual media: the
 * "machine" fetches the ISO and runs the real agent with its config.
 */
class VirtualMediaBoard implements Provider, AgentBootControl {
  readonly behaviour = new Map<string, Behaviour>();
  readonly told = new Map<string, Told[]>();
  readonly agents: ChildProcess[] = [];
  /** What happens, per provider ID, when the booter asks for the machine: after its claim, before its boot. */
  readonly onGetMachine = new Map<string, () => Promise<void>>();

  constructor(
    readonly type: string,
    private readonly dir: string,
  ) {}

  async listMachines(): Promise<Machine[]> {
    return [...this.behaviour.keys()].map((id) => this.#machine(id));
  }

  async getMachine(id: string): Promise<Machine> {
    if (!this.behaviour.has(id)) throw new MachineNotFoundError(this.type, id);
    await this.onGetMachine.get(id)?.();
    return this.#machine(id);
  }

  async createMachine(): Promise<Machine> {
    throw new NotImplementedError(this.type, 'createMachine');
  }

  async bootAgent(id: string, media: AgentBootMedia): Promise<AgentBootStarted> {
    this.#tell(id, { act: 'boot', isoUrl: media.isoUrl });
    const behaviour = this.behaviour.get(id);
    if (behaviour === 'refuses') throw new AgentBootError(id, 'the BMC refused InsertMedia (test)');
    if (behaviour === 'boots') await this.#bootFromIso(id, media.isoUrl);
    return { method: 'virtual-media', detail: `test BMC of ${id}: ${behaviour}` };
  }

  async endAgentBoot(id: string): Promise<void> {
    this.#tell(id, { act: 'end' });
  }

  /** What the machine's firmware and the image's /init do: the ISO's config unpacked, the agent enrolling with it. */
  async #bootFromIso(id: string, isoUrl: string): Promise<void> {
    const response = await fetch(isoUrl);
    expect(response.status).toBe(200);
    // Each boot unpacks afresh, as a machine's RAM does: the first into `id`, a later one beside it.
    const boots = (this.told.get(id) ?? []).filter((told) => told.act === 'boot').length;
    const machineDir = path.join(this.dir, boots === 1 ? id : `${id}-${boots}`);
    await mkdir(machineDir, { recursive: true });
    const iso = path.join(machineDir, 'agent.iso');
    await writeFile(iso, Buffer.from(await response.arrayBuffer()));
    const cpio = path.join(machineDir, 'config.cpio');
    await run('xorriso', ['-osirrox', 'on', '-indev', iso, '-extract', '/boot/config.cpio', cpio]);
    const root = path.join(machineDir, 'root');
    await mkdir(root);
    await run('sh', ['-c', `busybox cpio -i -d < "${cpio}"`], { cwd: root });
    const agent = spawn(
      process.execPath,
      [agentBin, 'enroll', '--enrollment', path.join(root, 'etc/bmaas/enrollment.json'), '--interval', '500ms'],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    this.agents.push(agent);
  }

  #tell(id: string, told: Told): void {
    this.told.set(id, [...(this.told.get(id) ?? []), told]);
  }

  #machine(id: string): Machine {
    return {
      id,
      address: undefined,
      availability: Availability.KnownUsed,
      failed: false,
      agentBoot: 'virtual-media',
      macs: [],
    };
  }
}

let dir: string;
let server: BmaasServer;
let files: AgentBootFiles;
let board: VirtualMediaBoard;
const stop = new AbortController();
let loop: Promise<void>;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-booter-'));
  const tls = await selfSignedServerTls(dir);
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  const imageDir = await smallAgentImage(dir);
  files = await AgentBootFiles.start({
    imageDir,
    workDir: path.join(dir, 'work'),
    listen: { host: '127.0.0.1', port: 0 },
  });
  board = new VirtualMediaBoard(PROVIDER, path.join(dir, 'machines'));
  const booter = new AgentBooter(board, files, {
    agentEndpoint: `localhost:${server.port}`,
    agentEndpointCaCertificate: new X509Certificate(tls.cert).raw,
    enrollmentWithin: 60_000,
    enrollmentPollInterval: 100,
    // Silent after 9 s: its agents are told to heartbeat every 3 s.
    heartbeatWithin: 9_000,
  });
  loop = booter.run(bmdb, { signal: stop.signal, parallelism: 4, maxIdleDelay: 200 });
});

afterAll(async () => {
  stop.abort();
  await loop;
  for (const agent of board?.agents ?? []) agent.kill('SIGTERM');
  await files?.close();
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A provided machine whose inventory says its BMC boots its agent from virtual media. */
async function bmcBootedMachine(providerId: string, behaviour: Behaviour, on = board): Promise<string> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: on.type, providerId });
  on.behaviour.set(providerId, behaviour);
  await setAgentBootMethods(q, on.type, new Map([[providerId, 'virtual-media']]));
  return machineId;
}

const history = (machineId: string) =>
  q
    .selectFrom('work_history')
    .select(['event', 'process'])
    .where('machine_id', '=', machineId)
    .where('process', '=', Process.ShepherdAgentBoot)
    .orderBy('timestamp')
    .execute();

const backoff = (machineId: string) =>
  q
    .selectFrom('work_backoff')
    .select('cause')
    .where('machine_id', '=', machineId)
    .where('process', '=', Process.ShepherdAgentBoot)
    .executeTakeFirst();

describe('a machine whose BMC boots its agent', () => {
  test('is booted from its ISO, its agent enrolls and heartbeats, the media is ejected and the ISO gone', async () => {
    const machineId = await bmcBootedMachine('vm-boots', 'boots');
    const started = await eventually(
      'the agent enrolled',
      () =>
        q
          .selectFrom('machine_agent_started')
          .select('agent_public_key')
          .where('machine_id', '=', machineId)
          .executeTakeFirst(),
      60_000,
    );
    // The key recorded is the one the agent made and wrote down after enrolling.
    const handover = JSON.parse(
      await readFile(path.join(dir, 'machines', 'vm-boots', 'root', 'etc', 'bmaas', 'enrollment.json'), 'utf8'),
    ) as { token: string };
    expect(handover.token.length).toBeGreaterThan(20);
    // The agent heartbeats three times within the recoverer's threshold, so a late one never makes it silent.
    expect(await readFile(path.join(dir, 'machines', 'vm-boots', 'root', 'etc', 'bmaas', 'agent-flags'), 'utf8')).toBe(
      '--interval=3000ms\n',
    );
    expect(started?.agent_public_key.length).toBe(32);
    await eventually(
      'its first heartbeat',
      () =>
        q
          .selectFrom('machine_agent_heartbeat')
          .select('agent_heartbeat_at')
          .where('machine_id', '=', machineId)
          .executeTakeFirst(),
      30_000,
    );
    await eventually('the work finished', async () =>
      (await history(machineId)).some((row) => row.event === 'Finished') ? true : undefined,
    );
    expect((await history(machineId)).map((row) => row.event)).toEqual(['Started', 'Finished']);
    const told = board.told.get('vm-boots') ?? [];
    expect(told.map((t) => t.act)).toEqual(['boot', 'end']);
    const [boot] = told;
    if (boot?.act !== 'boot') throw new Error('no boot told');
    // The boot's ISO, which held the token, is gone once the agent enrolled.
    expect((await fetch(boot.isoUrl)).status).toBe(404);
    // The token was used: a second enrollment with it is refused.
    const refused = spawn(
      process.execPath,
      [
        agentBin,
        'enroll',
        '--enrollment',
        path.join(dir, 'machines', 'vm-boots', 'root', 'etc', 'bmaas', 'enrollment.json'),
        '--interval',
        '500ms',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    refused.stderr?.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const code = await new Promise<number | null>((resolve) => refused.on('exit', resolve));
    expect(code).toBe(1);
    expect(stderr).toContain(machineId);
    expect(stderr).not.toContain(handover.token);
  }, 120_000);

  test('whose agent never enrolls fails its work after the bound, naming the machine and the boot, and is ejected', async () => {
    // A booter of its own with a short bound, for a provider of its own, beside the suite's.
    const shortStop = new AbortController();
    const silentBoard = new VirtualMediaBoard('SilentBootTest', path.join(dir, 'machines'));
    const short = new AgentBooter(silentBoard, files, {
      agentEndpoint: `localhost:${server.port}`,
      enrollmentWithin: 500,
      enrollmentPollInterval: 100,
    });
    const machineId = await bmcBootedMachine('vm-silent', 'boots-nothing', silentBoard);
    const shortLoop = short.run(bmdb, { signal: shortStop.signal, maxIdleDelay: 200 });
    try {
      const row = await eventually('the work backed off', () => backoff(machineId), 60_000);
      expect(row?.cause).toContain(machineId);
      expect(row?.cause).toContain('no enrollment');
      expect(row?.cause).toContain('test BMC of vm-silent: boots-nothing');
      expect(new AgentEnrollmentTimeoutError(machineId, 'vm-silent', { method: 'network', detail: 'x' }, 1).name).toBe(
        'AgentEnrollmentTimeoutError',
      );
      const told = silentBoard.told.get('vm-silent') ?? [];
      expect(told.map((t) => t.act)).toEqual(['boot', 'end']);
      const [boot] = told;
      if (boot?.act !== 'boot') throw new Error('no boot told');
      expect((await fetch(boot.isoUrl)).status).toBe(404);
      expect((await history(machineId)).map((r) => r.event)).toEqual(['Started', 'Failed']);
    } finally {
      shortStop.abort();
      await shortLoop;
    }
  }, 90_000);

  test('whose BMC refuses fails its work with the refusal, its boot files gone', async () => {
    const machineId = await bmcBootedMachine('vm-refuses', 'refuses');
    const row = await eventually('the work backed off', () => backoff(machineId), 30_000);
    expect(row?.cause).toContain('machine vm-refuses: the agent cannot be booted: the BMC refused InsertMedia');
    const told = board.told.get('vm-refuses') ?? [];
    expect(told.map((t) => t.act)).toEqual(['boot', 'end']);
    const [boot] = told;
    if (boot?.act !== 'boot') throw new Error('no boot told');
    expect((await fetch(boot.isoUrl)).status).toBe(404);
  }, 60_000);

  test('whose enrolled agent went silent is booted into the agent again, and enrolls with a new key', async () => {
    const machineId = await bmcBootedMachine('vm-silenced', 'boots');
    const firstKey = await eventually(
      'the first agent enrolled and heartbeats',
      async () =>
        (
          await q
            .selectFrom('machine_agent_started')
            .innerJoin(
              'machine_agent_heartbeat',
              'machine_agent_heartbeat.machine_id',
              'machine_agent_started.machine_id',
            )
            .select('agent_public_key')
            .where('machine_agent_started.machine_id', '=', machineId)
            .executeTakeFirst()
        )?.agent_public_key,
      60_000,
    );
    // The agent stops (the machine hangs), and its last heartbeat is long past the suite's 9 s threshold.
    const first = board.agents.at(-1);
    first?.kill('SIGKILL');
    await q
      .updateTable('machine_agent_heartbeat')
      .set({ agent_heartbeat_at: new Date(Date.now() - 3_600_000) })
      .where('machine_id', '=', machineId)
      .execute();
    const secondKey = await eventually(
      'booted again, a second agent enrolled',
      async () => {
        const row = await q
          .selectFrom('machine_agent_started')
          .select('agent_public_key')
          .where('machine_id', '=', machineId)
          .executeTakeFirst();
        return row && !Buffer.from(row.agent_public_key).equals(Buffer.from(firstKey))
          ? row.agent_public_key
          : undefined;
      },
      60_000,
    );
    expect(secondKey.length).toBe(32);
    await eventually('the second boot finished', async () =>
      (await history(machineId)).length === 4 ? true : undefined,
    );
    expect((await history(machineId)).map((row) => row.event)).toEqual(['Started', 'Finished', 'Started', 'Finished']);
    expect((board.told.get('vm-silenced') ?? []).map((t) => t.act)).toEqual(['boot', 'end', 'boot', 'end']);
  }, 120_000);

  test('claimed, but installed or alive again before its boot (a heartbeat of before the claim): not booted', async () => {
    const image = {
      imageUrl: 'https://images.example.com/os.img',
      imageSha256: 'ab'.repeat(32),
      rootDevice: '/dev/sda',
      actor: 'alice@ops',
      reason: 'install',
    };
    // Each machine's old agent is silent past the thresholds; one was installing long ago.
    const silentMachine = async (providerId: string) => {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider: PROVIDER, providerId });
      await setAgentStarted(q, machineId, { publicKey: new Uint8Array(32).fill(9) });
      await setAgentHeartbeat(q, machineId, new Date(Date.now() - 3_600_000));
      board.behaviour.set(providerId, 'boots-nothing');
      return machineId;
    };
    const installed = await silentMachine('vm-installed-meanwhile');
    await requestOSInstallation(q, installed, image);
    await q
      .updateTable('machine_os_installation_request')
      .set({ installation_state: 'Delivered', delivered_at: new Date(Date.now() - 3 * 3_600_000) })
      .where('machine_id', '=', installed)
      .execute();
    const revived = await silentMachine('vm-revived');
    // What the heartbeat statements that began before the claim committed wrote once it had: the old agent's
    // Success (the machine runs its OS, its agent's tags gone), and the other's heartbeat.
    board.onGetMachine.set('vm-installed-meanwhile', async () => {
      await q
        .updateTable('machine_os_installation_request')
        .set({ installation_state: 'Succeeded' })
        .where('machine_id', '=', installed)
        .execute();
      await deleteAgentHeartbeat(q, installed);
      await deleteAgentStarted(q, installed);
    });
    board.onGetMachine.set('vm-revived', () => setAgentHeartbeat(q, revived));
    await setAgentBootMethods(
      q,
      PROVIDER,
      new Map([
        ['vm-installed-meanwhile', 'virtual-media'],
        ['vm-revived', 'virtual-media'],
      ]),
    );
    for (const machineId of [installed, revived]) {
      await eventually('the claim ended', async () => ((await history(machineId)).length === 2 ? true : undefined));
      expect((await history(machineId)).map((row) => row.event)).toEqual(['Started', 'Canceled']);
      expect(await backoff(machineId)).toBeUndefined();
    }
    expect(board.told.get('vm-installed-meanwhile')).toBeUndefined();
    expect(board.told.get('vm-revived')).toBeUndefined();
    expect(await agentEnrollment(q, installed)).toBeUndefined();
  }, 60_000);

  test('an ssh machine of the same provider is left to the initializer', async () => {
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: PROVIDER, providerId: 'vm-ssh' });
    board.behaviour.set('vm-ssh', 'boots');
    // A machine booted meanwhile shows the loop is running; the ssh one got no boot.
    await bmcBootedMachine('vm-after-ssh', 'refuses');
    await eventually('the later machine booted', async () => board.told.get('vm-after-ssh')?.[1], 30_000);
    expect(board.told.get('vm-ssh')).toBeUndefined();
    expect(await history(machineId)).toEqual([]);
  }, 60_000);
});
