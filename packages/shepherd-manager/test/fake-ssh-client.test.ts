import { randomUUID } from 'node:crypto';
import { describe, expect, test } from 'vitest';
import {
  AgentResponseError,
  encodeTakeoverInit,
  parseTakeoverResponse,
  SshAbortedError,
  SshDialError,
} from '../src/index.js';
import { FakeSshClient } from '../src/testing/index.js';

const target = { host: '192.0.2.1', port: 22, machineId: randomUUID() };
const init = { machineId: target.machineId, bmaasEndpoint: 'bmaas.example.com:443' };

describe('FakeSshClient', () => {
  test('answers like a well-behaved agent and records what it was asked', async () => {
    const client = new FakeSshClient();
    const connection = await client.dial(target, { connectTimeout: 1_000 });
    expect(client.openConnections).toBe(1);
    await connection.upload('/root/agent', new Uint8Array([1, 2, 3]));
    const result = await connection.execute('/root/agent', encodeTakeoverInit(init));
    expect(result.exitCode).toBe(0);
    expect(parseTakeoverResponse(result.stdout, init).key).toHaveLength(32);
    await connection.close();
    await connection.close();
    expect(client.openConnections).toBe(0);
    expect(client.dials).toEqual([target]);
    expect(client.uploads).toEqual([{ target, path: '/root/agent', data: new Uint8Array([1, 2, 3]) }]);
    expect(client.executions.map((execution) => execution.command)).toEqual(['/root/agent']);
  });

  test('fails like an agent on stdin that is not a TakeoverInit', async () => {
    const connection = await new FakeSshClient().dial(target, { connectTimeout: 1_000 });
    const result = await connection.execute('/root/agent', new Uint8Array([0x0a, 0xff]));
    expect(result.exitCode).toBe(1);
    expect(new TextDecoder().decode(result.stderr)).toMatch(/TakeoverInit/);
  });

  test('hooks replace answers, fail calls, or hang them until the signal', async () => {
    let calls = 0;
    const client = new FakeSshClient({
      execute: () => {
        calls++;
        if (calls === 1)
          return {
            stdout: new TextEncoder().encode('garbage'),
            stderr: new Uint8Array(),
            exitCode: 0,
            exitSignal: null,
          };
        if (calls === 2) return undefined;
        return new Promise(() => {});
      },
      upload: ({ path }) => {
        if (path === '/readonly/agent') throw new Error('permission denied');
      },
    });
    const connection = await client.dial(target, { connectTimeout: 1_000 });
    const garbage = await connection.execute('/root/agent', encodeTakeoverInit(init));
    expect(() => parseTakeoverResponse(garbage.stdout, init)).toThrow(AgentResponseError);
    const normal = await connection.execute('/root/agent', encodeTakeoverInit(init));
    expect(parseTakeoverResponse(normal.stdout, init).key).toHaveLength(32);
    // A hung call ends only by its signal: rejected as aborted, not left pending.
    await expect(
      connection.execute('/root/agent', encodeTakeoverInit(init), AbortSignal.timeout(200)),
    ).rejects.toBeInstanceOf(SshAbortedError);
    await expect(connection.upload('/readonly/agent', new Uint8Array())).rejects.toThrow('permission denied');
  });

  test('a hanging dial hook runs into the connect timeout', async () => {
    const client = new FakeSshClient({ dial: () => new Promise(() => {}) });
    const error = await client.dial(target, { connectTimeout: 200 }).catch((e) => e);
    expect(error).toBeInstanceOf(SshDialError);
    expect(error.timedOut).toBe(true);
    expect(error.message).toContain(target.machineId);
    expect(client.openConnections).toBe(0);
  });
});
