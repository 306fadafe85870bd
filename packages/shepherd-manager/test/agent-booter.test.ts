/**
 * The agent booter with its real parts around it: a real BMDB, the real
 * BMaaS server over TLS, the real boot files (two processes' of them, for
 * network boots), and the real agent. The BMC is a fake that does what a
 * machine's firmware does: booted from virtual media, it fetches the boot's
 * ISO from the URL it was given, takes the config initramfs out of it
 * (xorriso, busybox cpio: as the kernel unpacks it) and starts `bmaas-agent
 * enroll` with it, which makes its key, enrolls with the token and
 * heartbeats; network-booted, it asks for its iPXE script by MAC (from the
 * other process's boot files, as a site's DHCP may point there) and fetches
 * the config the script names. A BMC that boots nothing, and one that
 * refuses, fail the work with the cause, and the boot's files are gone and
 * its token revoked either way.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes, X509Certificate } from 'node:crypto';
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
  EnrollmentRefusedError,
  enrollAgent,
  newMachine,
  operatorHistory,
  Process,
  requestOSInstallation,
  setAgentBootMethods,
  setAgentHeartbeat,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { smallAgentImage } from '../../../test/support/agent-image.js';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import {
  type AgentBootControl,
  type AgentBootEnd,
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
  PowerOutcomeUnknownError,
  type Provider,
} from '../src/index.js';

const run = promisify(execFile);
const PROVIDER = 'BootTest';
const agentBin = fileURLToPath(new URL('../../agent/bin/agent.js', import.meta.url));

const { db, bmdb } = await testBMDB();
const q = bmdb.db;

/**
 * How the fake BMC answers a machine's agent boot. Virtual media: `boots`;
 * `boots-nothing`; `refuses`; `fetches-only` (the ISO fetched and unpacked,
 * no agent started); `boots-unknown` (the reset went out and its answer was
 * lost: the firmware boots, the BMC call fails with PowerOutcomeUnknownError);
 * `slow-bmc` (the BMC calls take an hour, by the database's clock, and the
 * firmware boots once the wait for the agent began); `boots-held` (the
 * agent starts when the test says). Network: `pxe-boots`; `pxe-fetched-first`
 * (someone on the boot network fetched the boot's script and config first);
 * `pxe-enrolled-first` (and enrolled with the token, and the booter took it
 * for the machine before the machine's own fetch came; the machine's next
 * boot is its own).
 */
type Behaviour =
  | 'boots'
  | 'boots-nothing'
  | 'refuses'
  | 'fetches-only'
  | 'boots-unknown'
  | 'slow-bmc'
  | 'boots-held'
  | 'pxe-boots'
  | 'pxe-fetched-first'
  | 'pxe-enrolled-first';

/** What the fake BMC was told, in order, per provider ID. */
type Told =
  | { readonly act: 'boot'; readonly isoUrl: string | undefined }
  | { readonly act: 'end'; readonly boot: AgentBootEnd };

/** A machine of the board: how its BMC behaves, and its NICs. */
interface BoardMachine {
  readonly behaviour: Behaviour;
  readonly macs: readonly string[];
}

/**
 * A provider whose machines' BMCs boot the agent from virtual media, or
 * over the network: the "machine" fetches what its firmware would and runs
 * the real agent with its config.
 */
class BmcBoard implements Provider, AgentBootControl {
  readonly machines = new Map<string, BoardMachine>();
  readonly told = new Map<string, Told[]>();
  readonly agents: ChildProcess[] = [];
  /** What a machine's firmware could not do (it runs beside the BMC's calls, so it cannot throw into them). */
  readonly firmwareFailures = new Map<string, string>();
  /** What `GET /agent-boot/ipxe?mac=` answered while a virtual media boot was under way. */
  readonly scriptsByMac = new Map<string, string>();
  /** Agents held until the test releases them (`boots-held`). */
  readonly held = new Map<string, () => void>();
  /** What happens, per provider ID, when the booter asks for the machine: after its claim, before its boot. */
  readonly onGetMachine = new Map<string, () => Promise<void>>();

  constructor(
    readonly type: string,
    private readonly dir: string,
    /** The boot files a network-booted machine's firmware asks, as the site's DHCP says: another process's. */
    private readonly networkFiles?: () => AgentBootFiles,
  ) {}

  async listMachines(): Promise<Machine[]> {
    return [...this.machines.keys()].map((id) => this.#machine(id));
  }

  async getMachine(id: string): Promise<Machine> {
    if (!this.machines.has(id)) throw new MachineNotFoundError(this.type, id);
    await this.onGetMachine.get(id)?.();
    return this.#machine(id);
  }

  async createMachine(): Promise<Machine> {
    throw new NotImplementedError(this.type, 'createMachine');
  }

  async bootAgent(id: string, media: AgentBootMedia): Promise<AgentBootStarted> {
    this.#tell(id, { act: 'boot', isoUrl: media.isoUrl });
    const { behaviour, macs } = this.machines.get(id) ?? { behaviour: 'boots-nothing', macs: [] };
    const started = (method: AgentBootStarted['method']) => ({ method, detail: `test BMC of ${id}: ${behaviour}` });
    if (behaviour === 'refuses') throw new AgentBootError(id, 'the BMC refused InsertMedia (test)');
    if (behaviour.startsWith('pxe-')) {
      this.#firmware(id, () => this.#bootFromNetwork(id, macs[0] ?? '', behaviour));
      return started('network');
    }
    const isoUrl = media.isoUrl;
    if (isoUrl === undefined) throw new Error(`test BMC of ${id}: virtual media without an ISO`);
    for (const mac of macs) {
      const files = this.networkFiles?.();
      if (files) this.scriptsByMac.set(mac, await (await fetch(`${files.url}/agent-boot/ipxe?mac=${mac}`)).text());
    }
    if (behaviour === 'boots') await this.#bootFromIso(id, isoUrl);
    // Held: the firmware boots beside the BMC's answer, its agent waiting for the test.
    if (behaviour === 'boots-held') this.#firmware(id, () => this.#bootFromIso(id, isoUrl, true));
    if (behaviour === 'fetches-only') await this.#unpackIso(id, isoUrl);
    if (behaviour === 'boots-unknown') {
      this.#firmware(id, () => this.#bootFromIso(id, isoUrl));
      throw new PowerOutcomeUnknownError(
        id,
        'ForceRestart',
        new Error(`machine ${id}: BMC test: the connection broke`),
      );
    }
    if (behaviour === 'slow-bmc') {
      // An hour of BMC calls, by the database's clock: the token issued before them is an hour older.
      await q
        .updateTable('machine_agent_enrollment')
        .set({
          issued_at: sql<Date>`issued_at - interval '1 hour'`,
          expires_at: sql<Date>`expires_at - interval '1 hour'`,
        })
        .where('machine_id', '=', await machineIdOf(id))
        .execute();
      // The firmware boots while the booter waits: once the wait began, the token is good again, or never.
      this.#firmware(id, async () => {
        await eventually(
          'the token good for the wait',
          async () =>
            ((await agentEnrollment(q, await machineIdOf(id)))?.expiresAt.getTime() ?? 0) > Date.now() || undefined,
          70_000,
        );
        await this.#bootFromIso(id, isoUrl);
      });
    }
    return started('virtual-media');
  }

  async endAgentBoot(id: string, boot: AgentBootEnd): Promise<void> {
    this.#tell(id, { act: 'end', boot });
  }

  /** Runs a machine's firmware beside the BMC's calls, keeping what failed. */
  #firmware(id: string, boot: () => Promise<void>): void {
    boot().catch((error: unknown) => this.firmwareFailures.set(id, String(error)));
  }

  /** Where a machine's RAM is: each boot unpacks afresh, the first into `id`, a later one beside it. */
  async #machineDir(id: string): Promise<string> {
    const boots = (this.told.get(id) ?? []).filter((told) => told.act === 'boot').length;
    const machineDir = path.join(this.dir, boots === 1 ? id : `${id}-${boots}`);
    await mkdir(path.join(machineDir, 'root'), { recursive: true });
    return machineDir;
  }

  /** What the machine's firmware and the image's /init do with an ISO: its config unpacked in the root. */
  async #unpackIso(id: string, isoUrl: string): Promise<string> {
    const response = await fetch(isoUrl);
    if (response.status !== 200) throw new Error(`machine ${id}: the ISO answered ${response.status}`);
    const machineDir = await this.#machineDir(id);
    const iso = path.join(machineDir, 'agent.iso');
    await writeFile(iso, Buffer.from(await response.arrayBuffer()));
    const cpio = path.join(machineDir, 'config.cpio');
    await run('xorriso', ['-osirrox', 'on', '-indev', iso, '-extract', '/boot/config.cpio', cpio]);
    await run('sh', ['-c', `busybox cpio -i -d < "${cpio}"`], { cwd: path.join(machineDir, 'root') });
    return path.join(machineDir, 'root');
  }

  async #bootFromIso(id: string, isoUrl: string, held = false): Promise<void> {
    const root = await this.#unpackIso(id, isoUrl);
    if (held) await new Promise<void>((resolve) => this.held.set(id, resolve));
    this.#startAgent(root);
  }

  /** What iPXE does: the script by MAC, then the config it names (the kernel's fetch left out), unpacked by the kernel. */
  async #bootFromNetwork(id: string, mac: string, behaviour: Behaviour): Promise<void> {
    const files = this.networkFiles?.();
    if (files === undefined) throw new Error('no boot files for network boots');
    const script = await (await fetch(`${files.url}/agent-boot/ipxe?mac=${mac}`)).text();
    const configUrl = /^initrd (\S+\/config\.cpio)$/m.exec(script)?.[1];
    if (configUrl === undefined) throw new Error(`machine ${id}: no config in the script: ${script}`);
    if (behaviour !== 'pxe-boots') {
      // A bystander who knows the MAC, faster than the machine's firmware.
      const stolen = Buffer.from(await (await fetch(configUrl)).arrayBuffer());
      this.stolen.set(id, stolen);
      if (behaviour === 'pxe-enrolled-first') {
        const machineId = await machineIdOf(id);
        const token = /"token":"([^"]+)"/.exec(stolen.toString('latin1'))?.[1] ?? '';
        await enrollAgent(q, { machineId, token, agentPublicKey: BYSTANDER_KEY });
        // The worst case: the booter saw the enrollment and finished before the machine's own fetch came.
        await eventually(
          'the booter took the bystander for the machine',
          async () => (await history(machineId)).some((row) => row.event === 'Finished') || undefined,
        );
        this.machines.set(id, { behaviour: 'pxe-boots', macs: [mac] });
      }
    }
    const response = await fetch(configUrl);
    if (response.status !== 200) throw new Error(`machine ${id}: the config answered ${response.status}`);
    const machineDir = await this.#machineDir(id);
    const cpio = path.join(machineDir, 'config.cpio');
    await writeFile(cpio, Buffer.from(await response.arrayBuffer()));
    await run('sh', ['-c', `busybox cpio -i -d < "${cpio}"`], { cwd: path.join(machineDir, 'root') });
    this.#startAgent(path.join(machineDir, 'root'));
  }

  /** The configs bystanders fetched first. */
  readonly stolen = new Map<string, Buffer>();

  #startAgent(root: string): void {
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
    const { behaviour, macs } = this.machines.get(id) ?? { behaviour: 'boots-nothing', macs: [] };
    return {
      id,
      address: undefined,
      availability: Availability.KnownUsed,
      failed: false,
      agentBoot: behaviour.startsWith('pxe-') ? 'network' : 'virtual-media',
      macs,
    };
  }
}

/** The key of an agent a bystander enrolled with a token it fetched. */
const BYSTANDER_KEY = new Uint8Array(32).fill(0xbb);

async function machineIdOf(providerId: string): Promise<string> {
  const row = await q
    .selectFrom('machine_provided')
    .select('machine_id')
    .where('provider_id', '=', providerId)
    .executeTakeFirstOrThrow();
  return row.machine_id;
}

let dir: string;
let server: BmaasServer;
let files: AgentBootFiles;
/** Another shepherd process's boot files on the same BMDB: where the site's DHCP points network boots. */
let otherFiles: AgentBootFiles;
let board: BmcBoard;
const stop = new AbortController();
let loop: Promise<void>;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-booter-'));
  const tls = await selfSignedServerTls(dir);
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  const imageDir = await smallAgentImage(dir);
  files = await AgentBootFiles.start({
    imageDir,
    db: q,
    workDir: path.join(dir, 'work'),
    listen: { host: '127.0.0.1', port: 0 },
  });
  otherFiles = await AgentBootFiles.start({
    imageDir,
    db: q,
    workDir: path.join(dir, 'work-other'),
    listen: { host: '127.0.0.1', port: 0 },
  });
  board = new BmcBoard(PROVIDER, path.join(dir, 'machines'), () => otherFiles);
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
  await otherFiles?.close();
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A provided machine whose inventory says its BMC boots its agent (over the network for the `pxe-` behaviours). */
async function bmcBootedMachine(
  providerId: string,
  behaviour: Behaviour,
  on = board,
  macs: readonly string[] = [],
): Promise<string> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: on.type, providerId });
  on.machines.set(providerId, { behaviour, macs });
  const method = behaviour.startsWith('pxe-') ? 'network' : 'virtual-media';
  await setAgentBootMethods(q, on.type, new Map([[providerId, method]]));
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

const workEnded = (machineId: string) =>
  eventually(
    'the work ended',
    async () => {
      const events = (await history(machineId)).map((row) => row.event);
      return events.length >= 2 ? events : undefined;
    },
    90_000,
  );

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
    const [boot, end] = told;
    if (boot?.act !== 'boot') throw new Error('no boot told');
    // Ended as it started, with this boot's image alone.
    expect(end).toEqual({ act: 'end', boot: { method: 'virtual-media', media: { isoUrl: boot.isoUrl } } });
    // The boot's ISO, which held the token, is gone once the agent enrolled.
    expect((await fetch(boot.isoUrl ?? '')).status).toBe(404);
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

  test('whose agent never enrolls fails its work after the bound, naming the machine and the boot, is ejected, and its token revoked at once', async () => {
    // A booter of its own with a short bound, for a provider of its own, beside the suite's.
    const shortStop = new AbortController();
    const silentBoard = new BmcBoard('SilentBootTest', path.join(dir, 'machines'), () => files);
    const short = new AgentBooter(silentBoard, files, {
      agentEndpoint: `localhost:${server.port}`,
      enrollmentWithin: 500,
      enrollmentPollInterval: 100,
    });
    // Its firmware fetched the ISO, and no agent came of it: the token in it must be good for nothing now.
    const machineId = await bmcBootedMachine('vm-silent', 'fetches-only', silentBoard, ['52:54:00:00:51:01']);
    const shortLoop = short.run(bmdb, { signal: shortStop.signal, maxIdleDelay: 200 });
    try {
      const row = await eventually('the work backed off', () => backoff(machineId), 60_000);
      expect(row?.cause).toContain(machineId);
      expect(row?.cause).toContain('no enrollment');
      expect(row?.cause).toContain('test BMC of vm-silent: fetches-only');
      expect(new AgentEnrollmentTimeoutError(machineId, 'vm-silent', { method: 'network', detail: 'x' }, 1).name).toBe(
        'AgentEnrollmentTimeoutError',
      );
      const told = silentBoard.told.get('vm-silent') ?? [];
      expect(told.map((t) => t.act)).toEqual(['boot', 'end']);
      const [boot] = told;
      if (boot?.act !== 'boot') throw new Error('no boot told');
      expect((await fetch(boot.isoUrl ?? '')).status).toBe(404);
      expect((await history(machineId)).map((r) => r.event)).toEqual(['Started', 'Failed']);
      // A virtual media boot is never answered by MAC: whoever knows the machine's MAC learns nothing.
      expect(silentBoard.scriptsByMac.get('52:54:00:00:51:01')).toBe(
        '#!ipxe\necho BMaaS shepherd: no agent boot is prepared for MAC 52:54:00:00:51:01; going on to the next boot device\nexit 1\n',
      );
      // The boot ended without its enrollment: its token was revoked then, not left good for the bound's grace.
      const handover = JSON.parse(
        await readFile(path.join(dir, 'machines', 'vm-silent', 'root', 'etc', 'bmaas', 'enrollment.json'), 'utf8'),
      ) as { token: string };
      const refused = await enrollAgent(q, { machineId, token: handover.token, agentPublicKey: randomBytes(32) }).catch(
        (e: unknown) => e,
      );
      expect(refused).toBeInstanceOf(EnrollmentRefusedError);
      expect((refused as EnrollmentRefusedError).reason).toBe('Expired');
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
    expect((await fetch(boot.isoUrl ?? '')).status).toBe(404);
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
      board.machines.set(providerId, { behaviour: 'boots-nothing', macs: [] });
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

  test('whose BMC took an hour to answer still has a token good for the whole wait, and enrolls', async () => {
    const machineId = await bmcBootedMachine('vm-slow-bmc', 'slow-bmc');
    expect(await workEnded(machineId)).toEqual(['Started', 'Finished']);
    expect(board.firmwareFailures.get('vm-slow-bmc')).toBeUndefined();
    const enrollment = await agentEnrollment(q, machineId);
    expect(enrollment?.enrolledAt).toBeInstanceOf(Date);
  }, 120_000);

  test('whose reset went out unanswered (PowerOutcomeUnknownError) is waited for, not ejected at once, and enrolls', async () => {
    const machineId = await bmcBootedMachine('vm-unknown', 'boots-unknown');
    expect(await workEnded(machineId)).toEqual(['Started', 'Finished']);
    expect(board.firmwareFailures.get('vm-unknown')).toBeUndefined();
    expect((board.told.get('vm-unknown') ?? []).map((t) => t.act)).toEqual(['boot', 'end']);
    expect((await agentEnrollment(q, machineId))?.enrolledAt).toBeInstanceOf(Date);
  }, 120_000);

  test('a look for the enrollment that fails (the BMDB failing over) is looked again: the boot goes on and its agent enrolls', async () => {
    const machineId = await bmcBootedMachine('vm-poll', 'boots-held');
    const release = await eventually(
      'the machine booted, its agent held',
      async () => board.held.get('vm-poll'),
      60_000,
    );
    // The wait began once the token was made good for it, from the BMC's answer on.
    await eventually('the wait for the enrollment began', async () => {
      const { rows } = await sql<{ renewed: boolean }>`
        SELECT expires_at > issued_at + interval '120 seconds' AS renewed FROM machine_agent_enrollment
        WHERE machine_id = ${machineId}`.execute(q);
      return rows[0]?.renewed || undefined;
    });
    // The next look blocks on a lock; its connection is then cut, as a failover cuts it.
    const locker = new pg.Client({ connectionString: db.url });
    await locker.connect();
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE machine_agent_enrollment IN ACCESS EXCLUSIVE MODE');
      const pid = await eventually('a look for the enrollment blocked', async () => {
        const { rows } = await db.admin(
          `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
             AND query ILIKE 'select%from "machine_agent_enrollment"%'`,
        );
        return rows[0]?.pid as number | undefined;
      });
      await db.admin('SELECT pg_terminate_backend($1)', [pid]);
    } finally {
      await locker.query('ROLLBACK');
      await locker.end();
    }
    release();
    expect(await workEnded(machineId)).toEqual(['Started', 'Finished']);
    expect((await agentEnrollment(q, machineId))?.enrolledAt).toBeInstanceOf(Date);
  }, 120_000);
  test('an ssh machine of the same provider is left to the initializer', async () => {
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: PROVIDER, providerId: 'vm-ssh' });
    board.machines.set('vm-ssh', { behaviour: 'boots', macs: [] });
    // A machine booted meanwhile shows the loop is running; the ssh one got no boot.
    await bmcBootedMachine('vm-after-ssh', 'refuses');
    await eventually('the later machine booted', async () => board.told.get('vm-after-ssh')?.[1], 30_000);
    expect(board.told.get('vm-ssh')).toBeUndefined();
    expect(await history(machineId)).toEqual([]);
  }, 60_000);
});

describe('a machine whose BMC boots its agent over the network', () => {
  test('is answered by MAC by another process’s boot files: its config served once, its agent enrolls, its boot ended', async () => {
    const machineId = await bmcBootedMachine('pxe-boots', 'pxe-boots', board, ['52:54:00:00:aa:01']);
    expect(await workEnded(machineId)).toEqual(['Started', 'Finished']);
    expect(board.firmwareFailures.get('pxe-boots')).toBeUndefined();
    expect((await agentEnrollment(q, machineId))?.enrolledAt).toBeInstanceOf(Date);
    // Its config carried the agent's flags; no ISO, and no token ahead, was made for a network boot.
    expect(await readFile(path.join(dir, 'machines', 'pxe-boots', 'root', 'etc', 'bmaas', 'agent-flags'), 'utf8')).toBe(
      '--interval=3000ms\n',
    );
    expect(board.told.get('pxe-boots')).toEqual([
      { act: 'boot', isoUrl: undefined },
      { act: 'end', boot: { method: 'network', media: { isoUrl: undefined } } },
    ]);
    expect((await operatorHistory(q, machineId)).map((e) => [e.action, e.outcome])).toEqual([
      ['ServeBootConfig', 'Succeeded'],
      ['EnrollAgent', 'Succeeded'],
    ]);
    // The boot ended: its MAC is answered no more, by either process.
    for (const server of [otherFiles, files]) {
      expect(await (await fetch(`${server.url}/agent-boot/ipxe?mac=52:54:00:00:aa:01`)).text()).toMatch(
        /no agent boot is prepared for MAC 52:54:00:00:aa:01/,
      );
    }
  }, 120_000);

  test('whose config someone fetched first fails loudly, naming both fetchers; the token they got is revoked', async () => {
    const machineId = await bmcBootedMachine('pxe-first', 'pxe-fetched-first', board, ['52:54:00:00:aa:02']);
    expect(await workEnded(machineId)).toEqual(['Started', 'Failed']);
    const row = await backoff(machineId);
    expect(row?.cause).toBe(
      `machine ${machineId} (provider ID pxe-first): the config of its network boot was fetched again, by 127.0.0.1, after it was served to 127.0.0.1: the boot fails, and its token is revoked; if 127.0.0.1 is not the machine, someone on the boot network fetched its boot first`,
    );
    expect(board.firmwareFailures.get('pxe-first')).toBe('Error: machine pxe-first: the config answered 410');
    expect((await operatorHistory(q, machineId)).map((e) => [e.action, e.outcome])).toEqual([
      ['ServeBootConfig', 'Succeeded'],
      ['ServeBootConfig', 'Refused'],
    ]);
    // The bystander's token enrolls nothing.
    const stolen = board.stolen.get('pxe-first');
    const token = /"token":"([^"]+)"/.exec(stolen?.toString('latin1') ?? '')?.[1];
    expect(token).toBeDefined();
    const refused = await enrollAgent(q, { machineId, token: token ?? '', agentPublicKey: randomBytes(32) }).catch(
      (e: unknown) => e,
    );
    expect((refused as EnrollmentRefusedError).reason).toBe('Expired');
  }, 120_000);

  test('whose config a bystander fetched and enrolled with first: the machine’s own fetch makes that agent untrusted, and the machine is booted again into its own', async () => {
    const machineId = await bmcBootedMachine('pxe-enrolled', 'pxe-enrolled-first', board, ['52:54:00:00:aa:03']);
    await eventually(
      'booted again, the machine’s own agent enrolled',
      async () => {
        const events = (await history(machineId)).map((row) => row.event);
        return events.length === 4 && events[3] === 'Finished' ? events : undefined;
      },
      90_000,
    );
    expect((await history(machineId)).map((row) => row.event)).toEqual(['Started', 'Finished', 'Started', 'Finished']);
    expect(board.firmwareFailures.get('pxe-enrolled')).toBe('Error: machine pxe-enrolled: the config answered 410');
    const started = await q
      .selectFrom('machine_agent_started')
      .select('agent_public_key')
      .where('machine_id', '=', machineId)
      .executeTakeFirstOrThrow();
    expect(Buffer.from(started.agent_public_key).equals(Buffer.from(BYSTANDER_KEY))).toBe(false);
    const operatorEntries = await operatorHistory(q, machineId);
    expect(operatorEntries.map((e) => [e.action, e.outcome])).toEqual([
      ['ServeBootConfig', 'Succeeded'],
      ['EnrollAgent', 'Succeeded'],
      ['ServeBootConfig', 'Refused'],
      ['ServeBootConfig', 'Succeeded'],
      ['EnrollAgent', 'Succeeded'],
    ]);
    expect(operatorEntries[2]?.cause).toContain(
      'the agent its token enrolled is trusted no more (AgentStarted removed)',
    );
  }, 120_000);
});
