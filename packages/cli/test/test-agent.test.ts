/**
 * The bundled test agent after takeover, against a real BMaaS server over
 * TLS: it answers and detaches, heartbeats with its own key and a hardware
 * report, rides out the server being down, and stops on SIGTERM.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { hardwareReport, newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { AgentHardwareReportSchema, BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { encodeTakeoverInit, parseTakeoverResponse, type TakeoverInitParams } from '@bmaas/shepherd-manager';
import { fromBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from './helpers.js';

const TEST_AGENT = path.resolve('packages/shepherd-manager/bin/test-agent.js');

let dir: string;
const pids: number[] = [];

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'test-agent-heartbeat-'));
});
afterAll(async () => {
  for (const pid of pids) killQuietly(pid);
  await rm(dir, { recursive: true, force: true });
});

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {}
}

/** Runs the test agent's takeover as sshd would; resolves with its answer once the command returned. */
function takeover(init: TakeoverInitParams, env: Record<string, string>): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [TEST_AGENT], { stdio: 'pipe', env: { ...process.env, ...env } });
    const stdout: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk;
    });
    child.on('error', reject);
    // 'close': stdout and stderr ended too, as an SSH command's channel does.
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(stdout)) : reject(new Error(stderr))));
    child.stdin.end(encodeTakeoverInit(init));
  });
}

/** The detached heartbeater of `machineId`, found by its command line. */
async function heartbeaterPid(machineId: string): Promise<number | undefined> {
  const { readdir } = await import('node:fs/promises');
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = (await readFile(`/proc/${entry}/cmdline`, 'utf8')).split('\0');
      if (cmdline.includes('--heartbeat') && cmdline.includes(machineId)) return Number(entry);
    } catch {}
  }
  return undefined;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test('answers, detaches, heartbeats with its key and a hardware report, rides out an outage, stops on SIGTERM', async () => {
  const tls = await selfSignedServerTls(dir);
  let server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  const port = server.port;
  const q = bmdb.db;
  const machineId = await newMachine(q);
  const init: TakeoverInitParams = {
    machineId,
    bmaasEndpoint: `127.0.0.1:${port}`,
    caCertificate: new Uint8Array(new (await import('node:crypto')).X509Certificate(tls.cert).raw),
  };
  const log = path.join(dir, 'agent.log');
  const { key } = parseTakeoverResponse(
    await takeover(init, { SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: '200ms', SHEPHERD_TEST_AGENT_LOG: log }),
    init,
  );
  const pid = await eventually(() => heartbeaterPid(machineId));
  pids.push(pid);
  // What the initializer does once the command returned: the heartbeats refused until then now count.
  await setAgentStarted(q, machineId, { publicKey: key });

  const heartbeats = async () =>
    (await db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId]))
      .rows[0]?.agent_heartbeat_at as Date | undefined;
  const first = await eventually(heartbeats);
  const report = await eventually(() => hardwareReport(q, machineId));
  const decoded = fromBinary(AgentHardwareReportSchema, report.raw);
  expect(decoded.report?.memoryInstalledBytes).toBeGreaterThan(0n);
  expect(decoded.report?.cpu[0]?.hardwareThreads).toBeGreaterThan(0);
  // Heartbeats go on, every interval.
  await eventually(async () => ((await heartbeats())?.getTime() ?? 0) > first.getTime() || undefined);

  // The server goes away; the agent keeps trying, and heartbeats again once it is back.
  await server.close();
  await eventually(async () => (/heartbeat failed/.test(await readFile(log, 'utf8')) ? true : undefined));
  const during = await heartbeats();
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port }, tls });
  try {
    await eventually(async () => ((await heartbeats())?.getTime() ?? 0) > (during?.getTime() ?? 0) || undefined);
    expect(alive(pid)).toBe(true);
    process.kill(pid, 'SIGTERM');
    await eventually(async () => (alive(pid) ? undefined : true));
    expect(await readFile(log, 'utf8')).toMatch(/stopped\n$/);
  } finally {
    await server.close();
  }
});

test('takes no heartbeat to a name reserved never to resolve: nothing detached', async () => {
  const machineId = randomUUID();
  const init = { machineId, bmaasEndpoint: 'bmaas.example.com:443', caCertificate: new Uint8Array() };
  parseTakeoverResponse(await takeover(init, {}), init);
  expect(await heartbeaterPid(machineId)).toBeUndefined();
});
