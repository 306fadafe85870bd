/**
 * `bmaas-agent enroll`, the agent as a process against the real server over
 * TLS and a real BMDB: a BMC-booted machine's agent makes its key, enrolls
 * with the one-time token of its enrollment file (made by
 * agentEnrollmentArchive, as a boot's config initramfs carries it), and
 * heartbeats as `run` does; a refusal ends it naming the machine.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createPrivateKey, createPublicKey, X509Certificate } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { agentEnrollment, hardwareReport, issueEnrollmentToken, newMachine, operatorHistory } from '@bmaas/bmdb-model';
import { BmaasServer, type ServerTls, selfSignedServerTls } from '@bmaas/server';
import { create } from '@bufbuild/protobuf';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { parseEnrollment } from '../src/enrollment.js';
import { agentEnrollmentArchive, Secret } from '../src/index.js';

const packageDir = fileURLToPath(new URL('..', import.meta.url));
/** The agent's command line as built by `tsc --build` (bin/agent.js runs dist/cli.js). */
const agentBin = path.join(packageDir, 'bin/agent.js');
const root = path.join(packageDir, 'test/fixtures/bios-vm');
const { db, bmdb } = await testBMDB();
const q = bmdb.db;

let tls: ServerTls;
let server: BmaasServer;
let dir: string;
let caDer: Uint8Array;
/** Agents the tests started: each is ended with SIGTERM after the file's tests. */
const started = new Set<ChildProcess>();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'agent-enroll-'));
  tls = await selfSignedServerTls(dir);
  caDer = new X509Certificate(tls.cert).raw;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
});

afterAll(async () => {
  for (const child of started) child.kill('SIGTERM');
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

const lastHeartbeat = async (machineId: string) =>
  (
    await q
      .selectFrom('machine_agent_heartbeat')
      .select('agent_heartbeat_at')
      .where('machine_id', '=', machineId)
      .executeTakeFirst()
  )?.agent_heartbeat_at;

/**
 * A machine with a token issued, and its enrollment file as the boot's
 * config initramfs carries it: the archive unpacked by busybox's cpio, as
 * the kernel unpacks it.
 */
async function bootedMachine(port = server.port) {
  const machineId = await newMachine(q);
  const { token } = await issueEnrollmentToken(q, machineId, { validForSeconds: 600 });
  const init = create(TakeoverInitSchema, { machineId, bmaasEndpoint: `localhost:${port}`, caCertificate: caDer });
  const unpacked = path.join(dir, machineId);
  await mkdir(unpacked);
  await new Promise<void>((resolve, reject) => {
    const cpio = execFile('busybox', ['cpio', '-i', '-d'], { cwd: unpacked }, (error) =>
      error ? reject(error) : resolve(),
    );
    cpio.stdin?.end(agentEnrollmentArchive({ init, token }));
  });
  return { machineId, token: token.reveal(), file: path.join(unpacked, 'etc/bmaas/enrollment.json'), unpacked };
}

/** `bmaas-agent enroll` as a process; resolves with its exit code and standard error once it exits. */
function enroll(args: readonly string[]) {
  const child = spawn(process.execPath, [agentBin, 'enroll', '--interval', '100ms', '--root', root, ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  started.add(child);
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<{ code: number | null; stderr: string }>((resolve) =>
    child.on('close', (code) => {
      started.delete(child);
      resolve({ code, stderr });
    }),
  );
  return { child, exited, stderr: () => stderr };
}

/** A TCP proxy to the server on `target`; `cut` ends every connection through it, as a network that lost them. */
async function tcpProxy(target: number) {
  const sockets = new Set<Socket>();
  const hold = (socket: Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
  };
  const proxy = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    hold(client);
    hold(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return {
    port: (proxy.address() as AddressInfo).port,
    cut: () => {
      for (const socket of sockets) socket.destroy();
    },
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise<void>((resolve) => proxy.close(() => resolve()));
    },
  };
}

describe('agentEnrollmentArchive', () => {
  test('holds /etc/bmaas/enrollment.json alone, mode 0600: the init and the token, as enroll reads them', async () => {
    const { machineId, token, file, unpacked } = await bootedMachine();
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const enrollment = parseEnrollment(await readFile(file, 'utf8'), file);
    expect(enrollment.init.machineId).toBe(machineId);
    expect(enrollment.token).toBe(token);
    const { stdout } = await promisify(execFile)('find', ['.', '-type', 'f'], { cwd: unpacked });
    expect(stdout.trim().split('\n')).toEqual(['./etc/bmaas/enrollment.json']);
  });

  test('refuses an init without a machine or endpoint, and an empty token', () => {
    const init = create(TakeoverInitSchema, { machineId: 'm-1', bmaasEndpoint: '10.0.2.2:4443' });
    expect(() => agentEnrollmentArchive({ init, token: new Secret('') })).toThrow(
      'enrollment archive of machine m-1: the token is empty',
    );
    expect(() =>
      agentEnrollmentArchive({ init: create(TakeoverInitSchema, { machineId: 'm-1' }), token: new Secret('t') }),
    ).toThrow('enrollment archive of machine m-1: the init has no bmaas_endpoint');
  });
});

describe('bmaas-agent enroll', () => {
  test('enrolls its own key with its hardware report, writes the handover, then heartbeats; the token is in no log line', async () => {
    const { machineId, token, file, unpacked } = await bootedMachine();
    const log = path.join(unpacked, 'agent.log');
    const handOver = path.join(unpacked, 'handover.json');
    const agent = enroll(['--enrollment', file, '--write-handover', handOver, '--log-file', log]);
    await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
    expect((await agentEnrollment(q, machineId))?.enrolledAt).toBeInstanceOf(Date);
    expect(await hardwareReport(q, machineId)).toBeDefined();
    // The key enrolled is the handover's: a restarted agent runs with it.
    expect((await stat(handOver)).mode & 0o777).toBe(0o600);
    await expectHandoverKeyStarted(handOver, machineId);
    const history = await operatorHistory(q, machineId);
    expect(history.map((e) => [e.action, e.outcome])).toEqual([['EnrollAgent', 'Succeeded']]);
    const first = await lastHeartbeat(machineId);
    await eventually('a later heartbeat', async () => {
      const later = await lastHeartbeat(machineId);
      return later && first && later > first ? later : undefined;
    });
    agent.child.kill('SIGTERM');
    expect((await agent.exited).code).toBe(0);
    const text = await readFile(log, 'utf8');
    expect(text).toContain(`${machineId}: enrolling at localhost:${server.port}`);
    expect(text).toContain(`${machineId}: enrolled`);
    expect(text).toContain(`${machineId}: heartbeating to`);
    expect(text + agent.stderr()).not.toContain(token);
  });

  test('refused (its token used already): exits 1 naming the machine and why, and writes no handover', async () => {
    const { machineId, token, file, unpacked } = await bootedMachine();
    const handOver = path.join(unpacked, 'handover.json');
    const first = enroll(['--enrollment', file, '--write-handover', handOver]);
    await eventually('the first enrolled', async () => (await agentEnrollment(q, machineId))?.enrolledAt);
    first.child.kill('SIGTERM');
    await first.exited;
    await rm(handOver);
    const second = await enroll(['--enrollment', file, '--write-handover', handOver]).exited;
    expect(second.code).toBe(1);
    expect(second.stderr).toContain(
      `bmaas-agent: enrollment of machine ${machineId} refused: its enrollment token was used already`,
    );
    expect(second.stderr).not.toContain(token);
    await expect(stat(handOver)).rejects.toThrow(/ENOENT/);
  });

  test('its answer lost (the connection cut while the server records it): enrolls on its retry, same token and key', async () => {
    const proxy = await tcpProxy(server.port);
    const { machineId, file, unpacked } = await bootedMachine(proxy.port);
    const log = path.join(unpacked, 'agent.log');
    const handOver = path.join(unpacked, 'handover.json');
    // The enrollment's UPDATE waits for this hold of the machine's token; the answer then comes to a cut connection.
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    let agent: ReturnType<typeof enroll> | undefined;
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM machine_agent_enrollment WHERE machine_id = $1 FOR UPDATE', [machineId]);
      agent = enroll(['--enrollment', file, '--write-handover', handOver, '--log-file', log]);
      await eventually('the enrollment waiting in the BMDB', async () => {
        const { rowCount } = await db.admin(
          `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rowCount ? true : undefined;
      });
      proxy.cut();
      await eventually('the agent saw its call fail', async () =>
        (await readFile(log, 'utf8').catch(() => '')).includes('enrollment failed') ? true : undefined,
      );
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
    try {
      await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
    } finally {
      agent?.child.kill('SIGTERM');
      await agent?.exited;
      await proxy.close();
    }
    // The first call enrolled the key; the retry was answered as it, and the handover holds that key.
    await expectHandoverKeyStarted(handOver, machineId);
    expect((await operatorHistory(q, machineId)).map((e) => [e.action, e.outcome])).toEqual([
      ['EnrollAgent', 'Succeeded'],
    ]);
    expect(await readFile(log, 'utf8')).toContain(`${machineId}: enrolled`);
  });

  test('refused (its machine installed meanwhile): runs the reboot command, so its disk boots, and exits 1', async () => {
    const { machineId, file, unpacked } = await bootedMachine();
    await db.admin(
      `INSERT INTO machine_os_installation_request (machine_id, generation, image_url, image_sha256, root_device,
         compression, requested_by, installation_state)
       VALUES ($1, 1, 'https://images.example.com/os.img', $2, '/dev/sda', 'none', 'tech', 'Succeeded')`,
      [machineId, 'ab'.repeat(32)],
    );
    const log = path.join(unpacked, 'agent.log');
    const rebooted = path.join(unpacked, 'rebooted');
    const handOver = path.join(unpacked, 'handover.json');
    const { code, stderr } = await enroll([
      '--enrollment',
      file,
      '--write-handover',
      handOver,
      '--log-file',
      log,
      '--reboot-command',
      `echo rebooted > ${rebooted}`,
    ]).exited;
    expect(code).toBe(1);
    expect(stderr).toContain(`bmaas-agent: machine ${machineId} is installed`);
    expect(await readFile(rebooted, 'utf8')).toBe('rebooted\n');
    const text = await readFile(log, 'utf8');
    expect(text).toContain(`${machineId}: machine ${machineId} is installed`);
    expect(text).toContain('rebooting: echo rebooted');
    expect(text).toContain('reboot command exited 0');
    await expect(stat(handOver)).rejects.toThrow(/ENOENT/);
  });

  test('while the server cannot be reached it tries again, with backoff, and enrolls once it can', async () => {
    // A port nothing listens on yet.
    const port = await new Promise<number>((resolve) => {
      const probe = createServer().listen(0, '127.0.0.1', () => {
        const { port } = probe.address() as { port: number };
        probe.close(() => resolve(port));
      });
    });
    const { machineId, file, unpacked } = await bootedMachine(port);
    const log = path.join(unpacked, 'agent.log');
    const agent = enroll(['--enrollment', file, '--log-file', log]);
    await eventually('two failed tries', async () => {
      const text = await readFile(log, 'utf8').catch(() => '');
      return (text.match(/enrollment failed \(.*\); again in \d+ ms/g) ?? []).length >= 2 ? true : undefined;
    });
    const late = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port }, tls });
    try {
      await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
    } finally {
      agent.child.kill('SIGTERM');
      await agent.exited;
      await late.close();
    }
    expect(await readFile(log, 'utf8')).toContain(`${machineId}: enrolled`);
  });

  test('an enrollment file that is not one: exits 1 naming the file and what is wrong', async () => {
    const { unpacked } = await bootedMachine();
    const { code, stderr } = await enroll(['--enrollment', path.join(unpacked, 'missing.json')]).exited;
    expect(code).toBe(1);
    expect(stderr).toContain('missing.json');
  });
});

/** The public key of the private key `handOver` holds is the one the BMDB started `machineId`'s agent with. */
async function expectHandoverKeyStarted(handOver: string, machineId: string): Promise<void> {
  const { privateKey } = JSON.parse(await readFile(handOver, 'utf8')) as { privateKey: string };
  const raw = Buffer.from(createPublicKey(createPrivateKey(privateKey)).export({ format: 'jwk' }).x ?? '', 'base64url');
  const started = await q
    .selectFrom('machine_agent_started')
    .select('agent_public_key')
    .where('machine_id', '=', machineId)
    .executeTakeFirstOrThrow();
  expect(Buffer.from(started.agent_public_key)).toEqual(raw);
}
