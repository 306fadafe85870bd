import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { TakeoverInitSchema, type TakeoverResponse } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { describe, expect, test } from 'vitest';
import {
  AgentResponseError,
  type AgentResponseRejection,
  encodeTakeoverInit,
  parseTakeoverResponse,
  type TakeoverInitParams,
  TakeoverResponseSchema,
} from '../src/index.js';

const testAgentPath = fileURLToPath(new URL('../bin/test-agent.js', import.meta.url));

const init: TakeoverInitParams = {
  machineId: randomUUID(),
  bmaasEndpoint: 'bmaas.example.com:443',
  caCertificate: new Uint8Array([0x30, 0x82, 0x01, 0x0a]),
};

function response(result: TakeoverResponse['result']): Uint8Array {
  return toBinary(TakeoverResponseSchema, create(TakeoverResponseSchema, { result }));
}

function successResponse(
  initMessage: TakeoverInitParams | undefined,
  key: Uint8Array,
  warning: string[] = [],
): Uint8Array {
  return response({
    case: 'success',
    value: {
      $typeName: 'cloud.agent.api.TakeoverSuccess',
      initMessage: initMessage && create(TakeoverInitSchema, initMessage),
      key,
      warning,
    },
  });
}

function rejectionOf(stdout: Uint8Array): AgentResponseError {
  try {
    parseTakeoverResponse(stdout, init);
  } catch (error) {
    expect(error).toBeInstanceOf(AgentResponseError);
    return error as AgentResponseError;
  }
  throw new Error('parseTakeoverResponse accepted the answer');
}

describe('TakeoverInit encoding', () => {
  test('is the wire form of cloud.agent.api.TakeoverInit', () => {
    const bytes = encodeTakeoverInit(init);
    const decoded = fromBinary(TakeoverInitSchema, bytes);
    expect(decoded.machineId).toBe(init.machineId);
    expect(decoded.bmaasEndpoint).toBe(init.bmaasEndpoint);
    expect(decoded.caCertificate).toEqual(init.caCertificate);
    // Field 1 (machine_id), wire type 2, first: what a Go agent parses.
    expect(Array.from(bytes.subarray(0, 2))).toEqual([0x0a, 36]);
  });

  test('leaves out an absent CA certificate', () => {
    const bytes = encodeTakeoverInit({ machineId: init.machineId, bmaasEndpoint: init.bmaasEndpoint });
    expect(bytes).toHaveLength(2 + 36 + 2 + init.bmaasEndpoint.length);
  });
});

describe('TakeoverResponse validation', () => {
  test('accepts a success echoing the init message with a 32-byte key, and passes warnings on', () => {
    const key = new Uint8Array(32).fill(9);
    const takeover = parseTakeoverResponse(successResponse(init, key, ['clock skew']), init);
    expect(takeover.key).toEqual(key);
    expect(takeover.warnings).toEqual(['clock skew']);
  });

  const rejections: [string, Uint8Array, AgentResponseRejection, RegExp][] = [
    [
      'an error result',
      response({ case: 'error', value: { $typeName: 'cloud.agent.api.TakeoverError', message: 'no disks found' } }),
      'agent-error',
      /agent reported an error: no disks found/,
    ],
    [
      'an init message for another machine',
      successResponse({ ...init, machineId: 'someone-else' }, new Uint8Array(32)),
      'init-mismatch',
      /machine_id "someone-else", sent "/,
    ],
    [
      'an init message with another endpoint',
      successResponse({ ...init, bmaasEndpoint: 'evil.example.com:443' }, new Uint8Array(32)),
      'init-mismatch',
      /bmaas_endpoint "evil.example.com:443"/,
    ],
    [
      'an init message without the CA certificate',
      successResponse({ ...init, caCertificate: undefined }, new Uint8Array(32)),
      'init-mismatch',
      /ca_certificate of 0 bytes, sent 4 bytes/,
    ],
    ['no init message', successResponse(undefined, new Uint8Array(32)), 'init-mismatch', /machine_id ""/],
    ['a 31-byte key', successResponse(init, new Uint8Array(31)), 'bad-key-length', /31 bytes, want 32/],
    ['a 33-byte key', successResponse(init, new Uint8Array(33)), 'bad-key-length', /33 bytes, want 32/],
    ['no key', successResponse(init, new Uint8Array()), 'bad-key-length', /0 bytes, want 32/],
    ['a truncated message', successResponse(init, new Uint8Array(32)).subarray(0, 20), 'unparseable', /\(20 bytes\)/],
    ['shell noise', new TextEncoder().encode('sh: 1: agent: not found\n'), 'unparseable', /not a TakeoverResponse/],
    ['nothing', new Uint8Array(), 'no-result', /neither success nor error/],
  ];

  test.each(rejections)('rejects %s', (_, stdout, reason, detail) => {
    const error = rejectionOf(stdout);
    expect(error.reason).toBe(reason);
    expect(error.machineId).toBe(init.machineId);
    expect(error.message).toContain(`agent on machine ${init.machineId}: `);
    expect(error.message).toMatch(detail);
  });

  test('an unparseable answer keeps the decoder error as its cause', () => {
    const error = rejectionOf(new Uint8Array([0x0a, 0xff]));
    expect(error.reason).toBe('unparseable');
    expect(error.cause).toBeInstanceOf(Error);
  });
});

/** Runs the test agent like sshd would: stdin in, stdout and stderr out. */
function runTestAgent(stdin: Uint8Array): Promise<{ stdout: Buffer; stderr: string; code: number | null }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [testAgentPath], { stdio: 'pipe' });
    const stdout: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ stdout: Buffer.concat(stdout), stderr, code }));
    child.stdin.end(stdin);
  });
}

describe('the test agent (bin/test-agent.js)', () => {
  test('is an executable node script using only built-ins', async () => {
    expect((await stat(testAgentPath)).mode & 0o111).toBe(0o111);
    const { readFile } = await import('node:fs/promises');
    const source = await readFile(testAgentPath, 'utf8');
    expect(source.startsWith('#!/usr/bin/env node\n')).toBe(true);
    const imports = [...source.matchAll(/^import .* from '([^']+)';$/gm)].map((match) => match[1]);
    expect(imports.length).toBeGreaterThan(0);
    for (const specifier of imports) expect(specifier).toMatch(/^node:/);
  });

  test('answers a TakeoverInit with a valid TakeoverSuccess and a fresh key each time', async () => {
    const keys = new Set<string>();
    for (let i = 0; i < 2; i++) {
      const { stdout, stderr, code } = await runTestAgent(encodeTakeoverInit(init));
      expect(stderr).toBe('');
      expect(code).toBe(0);
      const takeover = parseTakeoverResponse(stdout, init);
      expect(takeover.key).toHaveLength(32);
      keys.add(Buffer.from(takeover.key).toString('hex'));
    }
    expect(keys.size).toBe(2);
  });

  test('echoes the init message byte for byte, unknown fields included', async () => {
    const withUnknownField = Buffer.concat([encodeTakeoverInit(init), Buffer.from([0x78, 0x2a])]);
    const { stdout, code } = await runTestAgent(withUnknownField);
    expect(code).toBe(0);
    const decoded = fromBinary(TakeoverResponseSchema, stdout);
    expect(decoded.result.case).toBe('success');
    expect(parseTakeoverResponse(stdout, init).key).toHaveLength(32);
    // Field 1 of the response wraps TakeoverSuccess, whose field 1 is the init message as received.
    expect(Buffer.from(stdout).includes(withUnknownField)).toBe(true);
  });

  test.each([
    ['garbage', new TextEncoder().encode('hello'), /TakeoverInit/],
    ['a truncated message', encodeTakeoverInit(init).subarray(0, 10), /truncated/],
    ['no machine ID', encodeTakeoverInit({ machineId: '', bmaasEndpoint: 'x' }), /no machine_id/],
    ['nothing', new Uint8Array(), /no machine_id/],
  ])('fails on %s: message on stderr, non-zero exit, nothing on stdout', async (_, stdin, message) => {
    const { stdout, stderr, code } = await runTestAgent(stdin);
    expect(code).not.toBe(0);
    expect(stderr).toMatch(message);
    expect(stdout).toHaveLength(0);
  });
});
