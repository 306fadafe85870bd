import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { parseLimiter } from '@bmaas/bmdb-controlloop';
import { providedMachine, providedMachines, workHistory } from '@bmaas/bmdb-model';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { startTestSshServer, type TestSshServer } from '../../../test/support/sshd.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually, runUntil } from '../../../test/support/wait.js';
import {
  Initializer,
  type InitializerOptions,
  Provisioner,
  Recoverer,
  Ssh2Client,
  type SshExecResult,
  SshKey,
  TakeoverResponseSchema,
} from '../src/index.js';
import { FakeSshClient, type FakeSshHooks } from '../src/testing/index.js';
import { TestProvider } from './test-provider.js';

const { db, bmdb } = await testBMDB();

const fast = () => parseLimiter('1ms,1000');
const agentExecutable = new TextEncoder().encode("beep boop i'm a real program");

/** Provides `count` machines of a fresh TestProvider through the provisioner. */
async function provided(count: number, address = '127.0.0.1'): Promise<TestProvider> {
  const provider = new TestProvider(count);
  provider.address = address;
  const session = await bmdb.startSession();
  await new Provisioner(provider, { maxCount: count, chunkSize: count, creationLimiter: fast() }).reconcile(session);
  await session.close();
  return provider;
}

function initializer(
  provider: TestProvider,
  options: Partial<InitializerOptions> & Pick<InitializerOptions, 'sshClient'>,
) {
  return new Initializer(provider, {
    agentExecutable,
    agentTargetPath: '/fake/path',
    agentEndpoint: 'example.com:1234',
    sshConnectTimeout: 1_000,
    sshExecTimeout: 1_000,
    ...options,
  });
}

/** Runs `loop` (two workers, unthrottled) until `done` holds, then stops it cleanly. */
const runLoopUntil = (loop: { run: Initializer['run'] }, done: () => Promise<boolean>, timeout = 20_000) =>
  runUntil((signal) => loop.run(bmdb, { parallelism: 2, claimLimiter: fast(), signal }), done, { timeout });

async function machinesOf(provider: TestProvider) {
  return providedMachines(bmdb.db, provider.type).then((ms) => ms.map((m) => m.machineId));
}

async function agentKeys(provider: TestProvider): Promise<Map<string, Uint8Array>> {
  const { rows } = await db.admin(
    `SELECT a.machine_id, a.agent_public_key FROM machine_agent_started a
     JOIN machine_provided p USING (machine_id) WHERE p.provider = $1`,
    [provider.type],
  );
  return new Map(rows.map((r) => [r.machine_id, new Uint8Array(r.agent_public_key)]));
}

async function backoffs(provider: TestProvider) {
  const { rows } = await db.admin(
    `SELECT b.machine_id, b.cause, b.last_interval_seconds FROM work_backoff b
     JOIN machine_provided p USING (machine_id) WHERE p.provider = $1 AND b.process = 'ShepherdAgentStart'`,
    [provider.type],
  );
  return rows as { machine_id: string; cause: string; last_interval_seconds: number }[];
}

async function forget(provider: TestProvider): Promise<void> {
  await db.admin(
    'DELETE FROM machines WHERE machine_id IN (SELECT machine_id FROM machine_provided WHERE provider = $1)',
    [provider.type],
  );
}

describe('Initializer', () => {
  test('starts the agent on all of 10 machines', async () => {
    const provider = await provided(10);
    const ssh = new FakeSshClient();
    await runLoopUntil(initializer(provider, { sshClient: ssh }), async () => (await agentKeys(provider)).size === 10);

    const keys = await agentKeys(provider);
    expect([...keys.keys()].sort()).toEqual((await machinesOf(provider)).sort());
    for (const key of keys.values()) expect(key).toHaveLength(32);
    expect(ssh.uploads.map((u) => u.path)).toEqual(Array(10).fill('/fake/path'));
    expect(ssh.dials.every((t) => t.port === 22 && t.host === '127.0.0.1')).toBe(true);
    // Each agent was told its own machine ID.
    const told = ssh.executions.map((e) => fromBinary(TakeoverInitSchema, e.stdin).machineId).sort();
    expect(told).toEqual([...keys.keys()].sort());
    expect(ssh.openConnections).toBe(0);
    await forget(provider);
  });

  const garbage = (stdout: Uint8Array, exitCode = 0, stderr = ''): SshExecResult => ({
    stdout,
    stderr: new TextEncoder().encode(stderr),
    exitCode,
    exitSignal: null,
  });
  const answer = (result: Parameters<typeof create<typeof TakeoverResponseSchema>>[1]) =>
    toBinary(TakeoverResponseSchema, create(TakeoverResponseSchema, result));
  const badAgents: [string, FakeSshHooks['execute'], RegExp][] = [
    [
      'an error result',
      () => garbage(answer({ result: { case: 'error', value: { message: 'disk on fire' } } })),
      /agent reported an error: disk on fire/,
    ],
    [
      'an init message that differs',
      ({ stdin }) => {
        const init = fromBinary(TakeoverInitSchema, stdin);
        const echoed = { ...init, bmaasEndpoint: 'evil.example.com:1' };
        return garbage(
          answer({ result: { case: 'success', value: { initMessage: echoed, key: new Uint8Array(32) } } }),
        );
      },
      /echoed init message differs.*bmaas_endpoint "evil.example.com:1", sent "example.com:1234"/,
    ],
    [
      'a 31-byte key',
      ({ stdin }) =>
        garbage(
          answer({
            result: {
              case: 'success',
              value: { initMessage: fromBinary(TakeoverInitSchema, stdin), key: new Uint8Array(31) },
            },
          }),
        ),
      /agent key is 31 bytes, want 32/,
    ],
    [
      'unparseable stdout',
      () => garbage(new TextEncoder().encode('Segmentation fault\n')),
      /is not a TakeoverResponse/,
    ],
    [
      'a non-zero exit',
      () => garbage(new Uint8Array(), 3, 'cannot open /dev/kmsg'),
      /exited with status 3: cannot open \/dev\/kmsg/,
    ],
  ];

  test.each(badAgents)('fails the work when the agent answers with %s', async (_, execute, cause) => {
    const provider = await provided(1);
    await runLoopUntil(
      initializer(provider, { sshClient: new FakeSshClient({ execute }) }),
      async () => (await backoffs(provider)).length === 1,
    );
    const [backoff] = await backoffs(provider);
    expect(backoff?.cause).toMatch(cause);
    expect(backoff?.cause).toContain(backoff?.machine_id);
    expect(backoff?.last_interval_seconds).toBe(300); // the initializer's 5 min first backoff
    expect(await agentKeys(provider)).toEqual(new Map());
    await forget(provider);
  });

  test('an SSH server that accepts the connection and never answers fails the work after the timeout', async () => {
    const silent: Server = createServer(() => {}); // accepts, says nothing
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const port = (silent.address() as { port: number }).port;
    const dir = await mkdtemp(path.join(tmpdir(), 'silent-ssh-'));
    try {
      const key = await SshKey.loadOrGenerate(path.join(dir, 'id'));
      const provider = await provided(1);
      const started = performance.now();
      await runLoopUntil(
        initializer(provider, {
          sshClient: new Ssh2Client({ privateKey: key.privateKey }),
          sshPort: port,
          sshConnectTimeout: 500,
        }),
        async () => (await backoffs(provider)).length === 1,
      );
      expect(performance.now() - started).toBeLessThan(5_000);
      const [backoff] = await backoffs(provider);
      expect(backoff?.cause).toMatch(new RegExp(`127\\.0\\.0\\.1:${port}`));
      expect(backoff?.cause).toContain('not ready within the connect timeout of 500 ms');
      await forget(provider);
    } finally {
      silent.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('a machine without an address yet is looked at again in 30 s, not 5 min', async () => {
    const provider = await provided(1);
    for (const machine of provider.machines.values()) Object.assign(machine, { address: undefined });
    await runLoopUntil(
      initializer(provider, { sshClient: new FakeSshClient() }),
      async () => (await backoffs(provider)).length === 1,
    );
    const [backoff] = await backoffs(provider);
    expect(backoff?.cause).toMatch(/has no address to reach it at/);
    expect(backoff?.last_interval_seconds).toBe(30);
    await forget(provider);
  });

  test('an agent that started while the BMDB was unreachable is recorded once it is back, not started again', async () => {
    // The initializer's BMDB connection goes through a proxy the agent cuts while it "starts".
    const { proxy, url } = await TcpProxy.for(db.url);
    const cutOff = await openTestBMDB(db, { url });
    const provider = await provided(1);
    const [machineId] = (await machinesOf(provider)) as [string];
    let restore: NodeJS.Timeout | undefined;
    const ssh = new FakeSshClient({
      execute: () => {
        proxy.cut();
        // Back well within the session's 5 s deadline, as after a database restart.
        restore = setTimeout(() => proxy.restore(), 1_000);
        return undefined; // the agent started
      },
    });
    const stop = new AbortController();
    const running = initializer(provider, { sshClient: ssh }).run(cutOff, {
      claimLimiter: fast(),
      signal: stop.signal,
    });
    try {
      await eventually(
        'an agent started',
        async () => ((await agentKeys(provider)).size > 0 ? true : undefined),
        10_000,
      );
    } finally {
      stop.abort();
      await running;
      clearTimeout(restore);
      proxy.restore();
      await proxy.close();
    }
    expect((await agentKeys(provider)).size).toBe(1);
    expect(ssh.executions).toHaveLength(1); // started once
    const history = await workHistory(bmdb.db, machineId);
    expect(history.map((h) => h.event)).toEqual(['Started', 'Finished']);
    expect(await backoffs(provider)).toEqual([]);
    await forget(provider);
  });

  test('rejects bad options', () => {
    const provider = new TestProvider(0);
    const sshClient = new FakeSshClient();
    expect(() => initializer(provider, { sshClient, agentExecutable: new Uint8Array() })).toThrow(
      /executable is empty/,
    );
    expect(() => initializer(provider, { sshClient, agentEndpoint: '' })).toThrow(/endpoint must be set/);
    expect(() => initializer(provider, { sshClient, agentTargetPath: 'agent' })).toThrow(
      /must be absolute, got "agent"/,
    );
    expect(() => initializer(provider, { sshClient, sshPort: 70000 })).toThrow(/SSH port must be 1-65535, got 70000/);
    expect(() => initializer(provider, { sshClient, sshExecTimeout: 0 })).toThrow(/exec timeout must be > 0/);
  });
});

describe('Recoverer', () => {
  test('reboots a machine started 10 h ago with no heartbeat, clears its tags, and the initializer starts it again', async () => {
    const provider = await provided(2);
    const ssh = new FakeSshClient();
    await runLoopUntil(initializer(provider, { sshClient: ssh }), async () => (await agentKeys(provider)).size === 2);
    const [silent, healthy] = (await machinesOf(provider)) as [string, string];
    await db.admin(
      "UPDATE machine_agent_started SET agent_started_at = now() - interval '10 hours' WHERE machine_id = $1",
      [silent],
    );
    await db.admin(
      `UPDATE machine_agent_started SET agent_started_at = now() - interval '10 hours' WHERE machine_id = $1;`,
      [healthy],
    );
    await db.admin('INSERT INTO machine_agent_heartbeat VALUES ($1, now())', [healthy]);
    const silentProviderId = (await providedMachine(bmdb.db, silent))?.providerId;

    await runLoopUntil(new Recoverer(provider), async () => (await agentKeys(provider)).size === 1);
    expect(provider.powerCycles).toEqual([silentProviderId]);
    const heartbeats = await db.admin('SELECT machine_id FROM machine_agent_heartbeat WHERE machine_id = $1', [silent]);
    expect(heartbeats.rowCount).toBe(0);
    const history = await workHistory(bmdb.db, silent);
    expect(history.map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdAgentStart:Started',
      'ShepherdAgentStart:Finished',
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Finished',
    ]);

    const executionsBefore = ssh.executions.length;
    await runLoopUntil(initializer(provider, { sshClient: ssh }), async () => (await agentKeys(provider)).size === 2);
    expect(ssh.executions.length).toBe(executionsBefore + 1);
    expect(provider.powerCycles).toHaveLength(1); // exactly one power cycle
    await forget(provider);
  });

  test('names a machine whose heartbeat is stamped in the future, once, and leaves it alone', async () => {
    const { lines, restore } = captureDebugLog('shepherd:recoverer');
    try {
      const provider = await provided(2);
      const [ahead, fine] = (await machinesOf(provider)) as [string, string];
      for (const machine of [ahead, fine]) {
        await db.admin("INSERT INTO machine_agent_started VALUES ($1, now() - interval '2 hours', '\\x00')", [machine]);
      }
      await db.admin("INSERT INTO machine_agent_heartbeat VALUES ($1, now() + interval '400 days')", [ahead]);
      await db.admin("INSERT INTO machine_agent_heartbeat VALUES ($1, now() + interval '5 seconds')", [fine]);
      const recoverer = new Recoverer(provider, { auditInterval: 50 });
      await runLoopUntil(recoverer, async () => lines.length > 0);
      expect(await recoverer.auditHeartbeats(bmdb)).toBe(1); // jitter of a few seconds is no bad data
      const warnings = lines.filter((line) => line.includes('in the future'));
      expect(warnings).toHaveLength(1); // once, though audited every 50 ms
      expect(warnings[0]).toMatch(
        new RegExp(`machine ${ahead} \\(provider ID machine-0\\): agent heartbeat at \\S+ is 400 days in the future`),
      );
      expect(provider.powerCycles).toEqual([]); // the agent may be alive: not power-cycled
      expect(() => new Recoverer(provider, { auditInterval: 0 })).toThrow(/audit interval must be > 0/);
      await forget(provider);
    } finally {
      restore();
    }
  });

  test('a failed reboot backs the machine off for a minute', async () => {
    const provider = await provided(1);
    const [machineId] = (await machinesOf(provider)) as [string];
    await db.admin("INSERT INTO machine_agent_started VALUES ($1, now() - interval '1 hour', '\\x00')", [machineId]);
    provider.machines.clear(); // the provider lost it: reboot fails
    await runLoopUntil(new Recoverer(provider), async () => {
      const { rowCount } = await db.admin(
        "SELECT 1 FROM work_backoff WHERE machine_id = $1 AND process = 'ShepherdRecovery'",
        [machineId],
      );
      return rowCount === 1;
    });
    const { rows } = await db.admin('SELECT cause, last_interval_seconds FROM work_backoff WHERE machine_id = $1', [
      machineId,
    ]);
    expect(rows[0].cause).toMatch(/has no machine machine-0/);
    expect(rows[0].last_interval_seconds).toBe(60);
    await forget(provider);
  });
});

describe('against a real OpenSSH server', () => {
  const testAgentPath = fileURLToPath(new URL('../bin/test-agent.js', import.meta.url));
  let sshd: TestSshServer;
  let dir: string;
  let key: SshKey;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'initializer-sshd-'));
    key = await SshKey.loadOrGenerate(path.join(dir, 'id_ed25519'));
    sshd = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
    console.log(sshd.description);
  });
  afterAll(async () => {
    await sshd?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  test('the initializer uploads and runs the real test agent over SSH and SFTP, and records its key', async () => {
    const provider = await provided(3);
    const targetPath = path.join(dir, 'agent');
    const loop = new Initializer(provider, {
      agentExecutable: await readFile(testAgentPath),
      agentTargetPath: targetPath,
      agentEndpoint: 'bmaas.example.com:443',
      sshClient: new Ssh2Client({ privateKey: key.privateKey }),
      sshPort: sshd.port,
      sshConnectTimeout: 5_000,
      sshExecTimeout: 20_000,
    });
    const started = performance.now();
    await runLoopUntil(loop, async () => (await agentKeys(provider)).size === 3, 60_000);
    const elapsed = performance.now() - started;
    console.log(
      `3 agent starts against ${sshd.kind} took ${Math.round(elapsed)} ms (~${Math.round(elapsed / 3)} ms each, 2 in parallel)`,
    );

    const keys = await agentKeys(provider);
    expect(keys.size).toBe(3);
    for (const agentKey of keys.values()) expect(agentKey).toHaveLength(32);
    expect(new Set([...keys.values()].map((k) => Buffer.from(k).toString('hex'))).size).toBe(3);
    expect((await stat(targetPath)).mode & 0o777).toBe(0o755);

    // One start, timed on its own.
    const single = performance.now();
    const [machineId] = [...keys.keys()] as [string];
    const agentKey = await loop.startAgent(
      { host: '127.0.0.1', port: sshd.port, machineId },
      new AbortController().signal,
    );
    console.log(
      `one agent start (dial, upload, run, validate) against ${sshd.kind}: ${Math.round(performance.now() - single)} ms`,
    );
    expect(agentKey).toHaveLength(32);
    await forget(provider);
  });

  test('an agent that never exits fails the work at the exec timeout', async () => {
    const provider = await provided(1);
    const pidFile = path.join(dir, 'hanging-agent.pid');
    const loop = new Initializer(provider, {
      agentExecutable: new TextEncoder().encode(`#!/bin/sh\necho $$ > ${pidFile}\nexec sleep 600\n`),
      agentTargetPath: path.join(dir, 'hanging-agent'),
      agentEndpoint: 'bmaas.example.com:443',
      sshClient: new Ssh2Client({ privateKey: key.privateKey }),
      sshPort: sshd.port,
      sshConnectTimeout: 5_000,
      sshExecTimeout: 700,
    });
    try {
      await runLoopUntil(loop, async () => (await backoffs(provider)).length === 1);
    } finally {
      // As root, OpenSSH does not pass on the kill request: the agent would sleep on for 10 min.
      const pid = Number(await readFile(pidFile, 'utf8').catch(() => ''));
      if (pid > 0) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {}
      }
    }
    const [backoff] = await backoffs(provider);
    expect(backoff?.cause).toContain('exec timeout of 700 ms (upload and run) passed');
    expect(backoff?.cause).toContain(`127.0.0.1:${sshd.port}`);
    expect(backoff?.last_interval_seconds).toBe(300);
    await forget(provider);
  });
});
