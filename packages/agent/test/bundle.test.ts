import { execFile, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { AgentHardwareReportSchema } from '@bmaas/api/cloud/agent/api/agent_pb';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { hardwareReport, issueEnrollmentToken, newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { parseTakeoverResponse } from '@bmaas/shepherd-manager';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';

const execFileAsync = promisify(execFile);
const packageDir = fileURLToPath(new URL('..', import.meta.url));
const bundle = path.join(packageDir, 'dist/agent.cjs');
const fixtures = path.join(packageDir, 'test/fixtures');
const { bmdb } = await testBMDB();
const q = bmdb.db;

let server: BmaasServer;
let dir: string;
let caDer: Uint8Array;
/** Agents the tests started, by process ID: each is ended with SIGTERM after the file's tests. */
const started = new Set<number>();

beforeAll(async () => {
  // The bundle as `npm run bundle` makes it.
  await execFileAsync('npm', ['run', 'bundle'], { cwd: packageDir });
  dir = await mkdtemp(path.join(tmpdir(), 'agent-bundle-'));
  const tls = await selfSignedServerTls(dir);
  caDer = new X509Certificate(tls.cert).raw;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
}, 120_000);

afterAll(async () => {
  for (const pid of started) {
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      // Already gone.
    }
  }
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

const lastHeartbeat = async (machineId: string) =>
  (
    await bmdb.db
      .selectFrom('machine_agent_heartbeat')
      .select('agent_heartbeat_at')
      .where('machine_id', '=', machineId)
      .executeTakeFirst()
  )?.agent_heartbeat_at;

/** Runs the bundle with plain node, `stdin` on its standard input; resolves once it exits. */
function runBundle(args: readonly string[], stdin: Uint8Array = new Uint8Array()) {
  return new Promise<{ code: number | null; stdout: Buffer; stderr: string }>((resolve, reject) => {
    const child = spawn(process.execPath, [bundle, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    const stdout: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(stdout), stderr }));
    child.stdin.end(stdin);
  });
}

async function initFor(machineId: string) {
  const sent = { machineId, bmaasEndpoint: `localhost:${server.port}`, caCertificate: caDer };
  return { sent, bytes: toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent)) };
}

describe('the bundled agent, one file run by plain node', () => {
  test('--help prints the usage and exits 0', async () => {
    const { code, stdout } = await runBundle(['--help']);
    expect(code).toBe(0);
    expect(stdout.toString()).toMatch(/^Usage: bmaas-agent <command> \[flags\]/);
  });

  test('report prints the hardware inventory of the root it is given', async () => {
    const { code, stdout } = await runBundle(['report', '--root', path.join(fixtures, 'two-socket-server')]);
    expect(code).toBe(0);
    const inventory = JSON.parse(stdout.toString());
    expect(inventory.disks.map((disk: { path: string }) => disk.path)).toEqual([
      '/dev/nvme0n1',
      '/dev/sda',
      '/dev/sdb',
    ]);
    expect(inventory.nics).toHaveLength(4);
  });

  test('a bad flag exits 2 naming it', async () => {
    const { code, stderr } = await runBundle(['takeover', '--interval', 'soon']);
    expect(code).toBe(2);
    expect(stderr).toContain('--interval "soon": want a duration such as 500ms, 30s, 15m');
  });

  test('takeover of garbage answers a TakeoverError and exits 1', async () => {
    const { code, stdout, stderr } = await runBundle(['takeover'], Buffer.from([0xff, 0xff]));
    expect(code).toBe(1);
    expect(() => parseTakeoverResponse(stdout, { machineId: 'm', bmaasEndpoint: 'e' })).toThrow(
      /agent reported an error: standard input \(2 bytes\) is not a TakeoverInit/,
    );
    expect(stderr).toContain('is not a TakeoverInit');
  });

  test('enroll with a token that is not its machine’s is refused: exit 1, naming the machine and why', async () => {
    const machineId = await newMachine(q);
    await issueEnrollmentToken(q, machineId, { validForSeconds: 600 });
    const { bytes } = await initFor(machineId);
    const file = path.join(dir, `${machineId}.enrollment.json`);
    await writeFile(file, JSON.stringify({ init: Buffer.from(bytes).toString('base64'), token: 'not-its-token' }));
    const { code, stderr } = await runBundle([
      'enroll',
      '--enrollment',
      file,
      '--root',
      path.join(fixtures, 'bios-vm'),
    ]);
    expect(code).toBe(1);
    expect(stderr).toContain(
      `bmaas-agent: enrollment of machine ${machineId} refused: the enrollment token is not the one issued for it`,
    );
  });

  test('takeover answers, returns, and the detached agent heartbeats to the real server until SIGTERM, saying it runs in place', async () => {
    const machineId = await newMachine(q);
    const { sent, bytes } = await initFor(machineId);
    const log = path.join(dir, `${machineId}.log`);
    const root = path.join(fixtures, 'bios-vm');
    // As the initializer runs it over SSH: the command returns once the agent answered.
    const { code, stdout } = await runBundle(
      ['takeover', '--interval', '100ms', '--root', root, '--log-file', log],
      bytes,
    );
    expect(code).toBe(0);
    const { key } = parseTakeoverResponse(stdout, sent);
    await setAgentStarted(q, machineId, { publicKey: key });
    const pid = await eventually('the agent logged', async () => {
      const text = await readFile(log, 'utf8').catch(() => '');
      const match = / (\d+) [0-9a-f-]{36}: heartbeating to /.exec(text);
      return match ? Number(match[1]) : undefined;
    });
    started.add(pid);
    await eventually('a heartbeat recorded', () => lastHeartbeat(machineId));
    const stored = await hardwareReport(q, machineId);
    expect(stored).toBeDefined();
    // No --image-dir: the agent runs in place, refuses installations and wipes, and its report says so.
    expect(fromBinary(AgentHardwareReportSchema, stored?.raw ?? new Uint8Array()).warning).toContain(
      "the agent runs in place on the machine's own OS (no agent image to kexec into (no --image-dir)): it refuses installations and wipes",
    );
    process.kill(pid, 'SIGTERM');
    await eventually('the agent stopped', async () =>
      (await readFile(log, 'utf8')).includes(`${pid} ${machineId}: stopped`) ? true : undefined,
    );
    await eventually('its process gone', async () => {
      try {
        process.kill(pid, 0);
        return undefined;
      } catch {
        return true;
      }
    });
    started.delete(pid);
  });
});
