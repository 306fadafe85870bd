import { randomUUID } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { create, toBinary } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { HostileProxy } from '../../../test/support/hostile-proxy.js';
import { freePort } from '../../../test/support/ports.js';
import { startTestSshServer, type TestSshServer } from '../../../test/support/sshd.js';
import {
  AgentResponseError,
  type AgentResponseRejection,
  encodeTakeoverInit,
  HostKeyMismatchError,
  JsonFileHostKeyPinStore,
  MemoryHostKeyPinStore,
  parseTakeoverResponse,
  Ssh2Client,
  SshAbortedError,
  type SshConnection,
  SshDialError,
  SshExecError,
  SshKey,
  SshOutputLimitError,
  SshUploadError,
  type TakeoverInitParams,
  TakeoverResponseSchema,
} from '../src/index.js';

const testAgentPath = fileURLToPath(new URL('../bin/test-agent.js', import.meta.url));
// sshd gives sessions a default PATH; make sure the agent's `#!/usr/bin/env node` finds this node.
const withNode = (command: string) => `PATH=${path.dirname(process.execPath)}:$PATH ${command}`;

let dir: string;
let key: SshKey;
let sshd: TestSshServer;
let client: Ssh2Client;
const connectTimeout = 5_000;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ssh-client-test-'));
  key = await SshKey.loadOrGenerate(path.join(dir, 'id_ed25519'));
  sshd = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
  console.log(sshd.description);
  client = new Ssh2Client({ privateKey: key.privateKey });
});

afterAll(async () => {
  await sshd?.stop();
  await rm(dir, { recursive: true, force: true });
});

const target = (server: TestSshServer, machineId?: string) => ({ host: server.host, port: server.port, machineId });

async function withConnection<T>(run: (connection: SshConnection) => Promise<T>): Promise<T> {
  const connection = await client.dial(target(sshd, randomUUID()), { connectTimeout });
  try {
    return await run(connection);
  } finally {
    await connection.close();
  }
}

describe('agent start against a real SSH server', () => {
  test('uploads the test agent with mode 0755, runs it and accepts its answer', async () => {
    const agentBinary = await readFile(testAgentPath);
    const targetPath = path.join(dir, 'agent');
    const init: TakeoverInitParams = {
      machineId: randomUUID(),
      bmaasEndpoint: 'bmaas.example.com:443',
      caCertificate: new Uint8Array([0x30, 0x82, 0, 1, 2, 3]),
    };
    const timings: number[] = [];
    for (let i = 0; i < 5; i++) {
      const started = performance.now();
      const connection = await client.dial(target(sshd, init.machineId), { connectTimeout });
      try {
        await connection.upload(targetPath, agentBinary);
        const result = await connection.execute(withNode(targetPath), encodeTakeoverInit(init));
        expect(new TextDecoder().decode(result.stderr)).toBe('');
        expect(result.exitCode).toBe(0);
        const takeover = parseTakeoverResponse(result.stdout, init);
        expect(takeover.key).toHaveLength(32);
        expect(takeover.warnings).toEqual([]);
      } finally {
        await connection.close();
      }
      timings.push(performance.now() - started);
      expect(await readFile(targetPath)).toEqual(agentBinary);
      expect((await stat(targetPath)).mode & 0o777).toBe(0o755);
    }
    const sorted = [...timings].sort((a, b) => a - b);
    console.log(
      `agent start (dial + upload ${agentBinary.length} B + execute + validate) against ${sshd.kind}: ` +
        `first ${timings[0]?.toFixed(1)} ms, median ${sorted[2]?.toFixed(1)} ms, best ${sorted[0]?.toFixed(1)} ms`,
    );
  });

  test('upload replaces an existing file with one of mode 0755', async () => {
    const targetPath = path.join(dir, 'existing');
    await writeFile(targetPath, 'old contents, longer than the new ones', { mode: 0o600 });
    await withConnection((connection) => connection.upload(targetPath, new TextEncoder().encode('#!/bin/sh\n')));
    expect(await readFile(targetPath, 'utf8')).toBe('#!/bin/sh\n');
    expect((await stat(targetPath)).mode & 0o777).toBe(0o755);
    expect((await readdir(dir)).filter((name) => name.includes('.upload-'))).toEqual([]);
  });

  test('uploads replacing one file at once never leave it missing: each upload runs what it uploaded', async () => {
    // Machines sharing one host (tests) upload to the same path; a rename that is not atomic would let one run nothing.
    const targetPath = path.join(dir, 'shared');
    await Promise.all(
      [1, 2, 3, 4].map((n) =>
        withConnection(async (connection) => {
          for (let round = 0; round < 5; round++) {
            await connection.upload(targetPath, new TextEncoder().encode(`#!/bin/sh\necho ${n}\n`));
            const result = await connection.execute(targetPath, new Uint8Array());
            expect(new TextDecoder().decode(result.stderr)).toBe('');
            expect(new TextDecoder().decode(result.stdout)).toMatch(/^[1-4]\n$/);
          }
        }),
      ),
    );
  });

  test('upload replaces an agent executable that is still running from an earlier attempt', async () => {
    // A hung native "agent": Linux refuses to open a running executable for writing (ETXTBSY).
    const targetPath = path.join(dir, 'running-agent');
    const pidFile = path.join(dir, 'running-agent.pid');
    await withConnection(async (connection) => {
      await connection.upload(targetPath, await readFile('/bin/sleep'));
      const hung = connection.execute(`echo $$ > ${pidFile}; exec ${targetPath} 30`, new Uint8Array());
      await expect.poll(() => readFile(pidFile, 'utf8').catch(() => ''), { timeout: 5_000 }).toMatch(/\d/);
      try {
        await connection.upload(targetPath, await readFile(testAgentPath));
        const init = { machineId: randomUUID(), bmaasEndpoint: 'bmaas.example.com:443' };
        const result = await connection.execute(withNode(targetPath), encodeTakeoverInit(init));
        expect(parseTakeoverResponse(result.stdout, init).key).toHaveLength(32);
      } finally {
        killQuietly(Number(await readFile(pidFile, 'utf8')));
        await hung.catch(() => {});
      }
    });
  });

  test('upload into a missing directory fails with SshUploadError naming the path and target', async () => {
    const targetPath = path.join(dir, 'no-such-dir', 'agent');
    const error = await withConnection((connection) =>
      connection.upload(targetPath, new Uint8Array([1])).catch((e) => e),
    );
    expect(error).toBeInstanceOf(SshUploadError);
    expect(error.message).toContain(targetPath);
    expect(error.message).toContain(`${sshd.host}:${sshd.port}`);
  });

  test('execute reports exit status and stderr of a failing command', async () => {
    const result = await withConnection((connection) =>
      connection.execute('cat >/dev/null; echo oops >&2; exit 3', new Uint8Array([1, 2, 3])),
    );
    expect(result.exitCode).toBe(3);
    expect(result.exitSignal).toBeNull();
    expect(new TextDecoder().decode(result.stderr)).toBe('oops\n');
  });

  test('a closed connection fails execute and upload with typed errors', async () => {
    const connection = await client.dial(target(sshd), { connectTimeout });
    await connection.close();
    await connection.close();
    await expect(connection.execute('true', new Uint8Array())).rejects.toBeInstanceOf(SshExecError);
    await expect(connection.upload(path.join(dir, 'closed'), new Uint8Array())).rejects.toBeInstanceOf(SshUploadError);
  });

  test('a connection cut mid-upload or mid-command fails at once, saying so, not at the signal', async () => {
    // The network drops the connection once 256 KiB went out: half way through a 2 MiB upload.
    const proxy = await HostileProxy.start(sshd.port);
    try {
      const viaProxy = { host: '127.0.0.1', port: proxy.port };
      proxy.mode = { kind: 'cut', bytes: 256 * 1024 };
      const uploading = await client.dial(viaProxy, { connectTimeout });
      const started = performance.now();
      const uploadError = await uploading
        .upload(path.join(dir, 'cut'), new Uint8Array(2 * 1024 * 1024), AbortSignal.timeout(20_000))
        .catch((e) => e);
      expect(uploadError).toBeInstanceOf(SshUploadError);
      expect(uploadError.message).toMatch(/upload to .*cut: the connection was lost before the upload completed/);
      expect(performance.now() - started).toBeLessThan(10_000);
      expect(proxy.cuts).toBe(1);

      const executing = await client.dial(viaProxy, { connectTimeout });
      const execError = await executing
        .execute('cat >/dev/null', new Uint8Array(1024 * 1024), AbortSignal.timeout(20_000))
        .catch((e) => e);
      expect(execError).toBeInstanceOf(SshExecError);
      expect(execError.message).toMatch(/lost|closed/);
      expect(proxy.cuts).toBe(2);
    } finally {
      await proxy.close();
    }
  });

  test('a command that exits at once reports its status, though it may arrive with the channel opening', async () => {
    await withConnection(async (connection) => {
      for (let i = 0; i < 10; i++) {
        expect((await connection.execute('true', new Uint8Array())).exitCode).toBe(0);
        expect((await connection.execute('exit 7', new Uint8Array([1]))).exitCode).toBe(7);
      }
    });
  });

  test('execute passes stdin through unchanged', async () => {
    const stdin = new Uint8Array(300_000).map((_, i) => (i * 7) % 256);
    const result = await withConnection((connection) => connection.execute('cat', stdin));
    expect(result.exitCode).toBe(0);
    expect(Buffer.from(result.stdout).equals(Buffer.from(stdin))).toBe(true);
  });
});

describe('bad agents are rejected', () => {
  const init: TakeoverInitParams = { machineId: randomUUID(), bmaasEndpoint: 'bmaas.example.com:443' };
  const success = (initMessage: TakeoverInitParams, keyLength: number) =>
    toBinary(
      TakeoverResponseSchema,
      create(TakeoverResponseSchema, {
        result: { case: 'success', value: { initMessage, key: new Uint8Array(keyLength).fill(7) } },
      }),
    );
  const answers: [string, AgentResponseRejection, Uint8Array][] = [
    [
      'an error result',
      'agent-error',
      toBinary(
        TakeoverResponseSchema,
        create(TakeoverResponseSchema, { result: { case: 'error', value: { message: 'disk on fire' } } }),
      ),
    ],
    ['a different init message', 'init-mismatch', success({ ...init, machineId: randomUUID() }, 32)],
    ['a 31-byte key', 'bad-key-length', success(init, 31)],
    ['a 33-byte key', 'bad-key-length', success(init, 33)],
    ['garbage', 'unparseable', new TextEncoder().encode('Segmentation fault (core dumped)\n')],
    ['no result', 'no-result', new Uint8Array()],
  ];

  test.each(answers)('an agent answering %s: %s', async (_, reason, answer) => {
    // A shell script "agent" that swallows its stdin and prints a canned answer.
    const answerPath = path.join(dir, `answer-${reason}-${answer.length}`);
    const agentPath = `${answerPath}.sh`;
    const result = await withConnection(async (connection) => {
      await connection.upload(answerPath, answer);
      await connection.upload(agentPath, new TextEncoder().encode(`#!/bin/sh\ncat >/dev/null\ncat ${answerPath}\n`));
      return connection.execute(agentPath, encodeTakeoverInit(init));
    });
    expect(result.exitCode).toBe(0);
    expect(Buffer.from(result.stdout).equals(Buffer.from(answer))).toBe(true);
    const error = (() => {
      try {
        parseTakeoverResponse(result.stdout, init);
      } catch (e) {
        return e;
      }
    })();
    expect(error).toBeInstanceOf(AgentResponseError);
    expect((error as AgentResponseError).reason).toBe(reason);
    expect((error as AgentResponseError).message).toContain(init.machineId);
    if (reason === 'agent-error') expect((error as AgentResponseError).message).toContain('disk on fire');
  });

  test('output beyond the limit fails with SshOutputLimitError', async () => {
    const limited = new Ssh2Client({ privateKey: key.privateKey, maxOutputBytes: 1000 });
    const connection = await limited.dial(target(sshd), { connectTimeout });
    try {
      const error = await connection.execute('head -c 100000 /dev/zero', new Uint8Array()).catch((e) => e);
      expect(error).toBeInstanceOf(SshOutputLimitError);
      expect(error).toBeInstanceOf(SshExecError);
      expect(error.stream).toBe('stdout');
      expect(error.message).toContain('1000 bytes');
      // The connection survives the killed channel.
      expect((await connection.execute('echo fine', new Uint8Array())).exitCode).toBe(0);
    } finally {
      await connection.close();
    }
  });
});

describe('timeouts and aborts', () => {
  let silent: Server;
  const sockets = new Set<Socket>();

  beforeAll(async () => {
    // Accepts TCP connections and never says a word, like a machine stuck in its boot.
    silent = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  });

  afterAll(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise((resolve) => silent.close(resolve));
  });

  const silentTarget = (machineId?: string) => {
    const address = silent.address();
    if (!address || typeof address !== 'object') throw new Error('no address');
    return { host: '127.0.0.1', port: address.port, machineId };
  };

  test('dial to a server that never answers fails after the connect timeout', async () => {
    const machineId = randomUUID();
    const started = performance.now();
    const error = await client.dial(silentTarget(machineId), { connectTimeout: 400 }).catch((e) => e);
    const elapsed = performance.now() - started;
    expect(error).toBeInstanceOf(SshDialError);
    expect(error.timedOut).toBe(true);
    expect(error.message).toContain(machineId);
    expect(error.message).toContain(`127.0.0.1:${silentTarget().port}`);
    expect(elapsed).toBeGreaterThanOrEqual(390);
    // Without the timeout the dial would wait forever; the bound only tells the two apart.
    expect(elapsed).toBeLessThan(10_000);
  });

  test('dial is aborted by its signal before the connect timeout', async () => {
    const started = performance.now();
    const error = await client
      .dial(silentTarget(), { connectTimeout: 10_000, signal: AbortSignal.timeout(300) })
      .catch((e) => e);
    expect(error).toBeInstanceOf(SshAbortedError);
    // Ended by the signal, not by the 10 s connect timeout.
    expect(performance.now() - started).toBeLessThan(9_000);
  });

  test('dial to a closed port fails promptly, not as a timeout', async () => {
    // Free a moment ago and nobody listening now: the dial is refused.
    const port = await freePort();
    const error = await client.dial({ host: '127.0.0.1', port }, { connectTimeout }).catch((e) => e);
    expect(error).toBeInstanceOf(SshDialError);
    expect(error.timedOut).toBe(false);
    expect(error.message).toContain(`127.0.0.1:${port}`);
  });

  test('dial with a key the server does not know fails with SshDialError', async () => {
    const stranger = await SshKey.loadOrGenerate(path.join(dir, 'stranger'));
    const error = await new Ssh2Client({ privateKey: stranger.privateKey })
      .dial(target(sshd), { connectTimeout })
      .catch((e) => e);
    expect(error).toBeInstanceOf(SshDialError);
    expect(error.message).toMatch(/authentication/i);
  });

  test('a command that never ends is abandoned promptly when its signal aborts', async () => {
    const pidFile = path.join(dir, 'hanging.pid');
    try {
      await withConnection(async (connection) => {
        const started = performance.now();
        const error = await connection
          .execute(`echo $$ > ${pidFile}; exec sleep 30`, new Uint8Array(), AbortSignal.timeout(500))
          .catch((e) => e);
        const elapsed = performance.now() - started;
        expect(error).toBeInstanceOf(SshAbortedError);
        expect(error.message).toContain('sleep 30');
        expect(error.cause).toBeInstanceOf(DOMException);
        expect(elapsed).toBeGreaterThanOrEqual(490);
        // Abandoned on the signal, long before the command's 30 s.
        expect(elapsed).toBeLessThan(15_000);
        // The connection is still usable after the abandoned channel.
        expect((await connection.execute('true', new Uint8Array())).exitCode).toBe(0);
      });
    } finally {
      // OpenSSH ignores the KILL request in root sessions, so the command may still run.
      killQuietly(Number(await readFile(pidFile, 'utf8')));
    }
  });

  test('an already aborted signal fails execute and upload without touching the server', async () => {
    const reason = new Error('shutting down');
    await withConnection(async (connection) => {
      const signal = AbortSignal.abort(reason);
      const execError = await connection.execute('true', new Uint8Array(), signal).catch((e) => e);
      const uploadError = await connection.upload(path.join(dir, 'never'), new Uint8Array(), signal).catch((e) => e);
      for (const error of [execError, uploadError]) {
        expect(error).toBeInstanceOf(SshAbortedError);
        expect(error.cause).toBe(reason);
      }
    });
    await expect(stat(path.join(dir, 'never'))).rejects.toThrow(/ENOENT/);
  });
});

describe('host key pinning', () => {
  let other: TestSshServer;

  beforeAll(async () => {
    other = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
  });

  afterAll(async () => {
    await other?.stop();
  });

  test('pins the first key per machine and refuses a changed one', async () => {
    const pins = new MemoryHostKeyPinStore();
    const pinning = new Ssh2Client({ privateKey: key.privateKey, hostKeys: pins });
    const machineId = randomUUID();

    await (await pinning.dial(target(sshd, machineId), { connectTimeout })).close();
    expect(await pins.get(machineId)).toBe(sshd.hostKeyFingerprint);
    // Same server, same key: still fine.
    await (await pinning.dial(target(sshd, machineId), { connectTimeout })).close();

    const error = await pinning.dial(target(other, machineId), { connectTimeout }).catch((e) => e);
    expect(error).toBeInstanceOf(HostKeyMismatchError);
    expect(error.machineId).toBe(machineId);
    expect(error.pinnedFingerprint).toBe(sshd.hostKeyFingerprint);
    expect(error.presentedFingerprint).toBe(other.hostKeyFingerprint);
    for (const part of [machineId, `127.0.0.1:${other.port}`, sshd.hostKeyFingerprint, other.hostKeyFingerprint]) {
      expect(error.message).toContain(part);
    }

    // Unpinning (the machine was reinstalled) lets the new key in.
    await pins.unpin(machineId);
    await (await pinning.dial(target(other, machineId), { connectTimeout })).close();
    expect(await pins.get(machineId)).toBe(other.hostKeyFingerprint);
  });

  test('without a machine ID, pins by host:port', async () => {
    const pins = new MemoryHostKeyPinStore();
    await (
      await new Ssh2Client({ privateKey: key.privateKey, hostKeys: pins }).dial(target(sshd), { connectTimeout })
    ).close();
    expect(await pins.get(`127.0.0.1:${sshd.port}`)).toBe(sshd.hostKeyFingerprint);
  });

  test('a failed login pins nothing', async () => {
    const pins = new MemoryHostKeyPinStore();
    const stranger = await SshKey.loadOrGenerate(path.join(dir, 'stranger-pin'));
    const machineId = randomUUID();
    const error = await new Ssh2Client({ privateKey: stranger.privateKey, hostKeys: pins })
      .dial(target(other, machineId), { connectTimeout })
      .catch((e) => e);
    expect(error).toBeInstanceOf(SshDialError);
    expect(await pins.get(machineId)).toBeUndefined();
  });

  test('pins in a JSON file survive the store and are enforced by the next one', async () => {
    const file = path.join(dir, 'pins', 'known-hosts.json');
    const machineId = randomUUID();
    const first = new Ssh2Client({ privateKey: key.privateKey, hostKeys: new JsonFileHostKeyPinStore(file) });
    await (await first.dial(target(sshd, machineId), { connectTimeout })).close();
    expect(JSON.parse(await readFile(file, 'utf8'))).toEqual({ [machineId]: sshd.hostKeyFingerprint });

    const second = new Ssh2Client({ privateKey: key.privateKey, hostKeys: new JsonFileHostKeyPinStore(file) });
    const error = await second.dial(target(other, machineId), { connectTimeout }).catch((e) => e);
    expect(error).toBeInstanceOf(HostKeyMismatchError);
  });

  test('accept-any (the default) connects to both', async () => {
    const machineId = randomUUID();
    for (const server of [sshd, other]) {
      const connection = await client.dial(target(server, machineId), { connectTimeout });
      expect((await connection.execute('true', new Uint8Array())).exitCode).toBe(0);
      await connection.close();
    }
  });
});

function killQuietly(pid: number): void {
  try {
    if (pid > 0) process.kill(pid, 'SIGKILL');
  } catch {}
}
