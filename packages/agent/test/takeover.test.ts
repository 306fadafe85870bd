import { TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { AgentResponseError, parseTakeoverResponse } from '@bmaas/shepherd-manager';
import { create, toBinary } from '@bufbuild/protobuf';
import { describe, expect, test } from 'vitest';
import { IN_PLACE_WARNING, takeover } from '../src/takeover.js';

const sent = {
  machineId: '0b5c3e1e-7d3a-4f6e-9a51-2f7f4c1d9e01',
  bmaasEndpoint: 'bmaas.internal:4242',
  caCertificate: new Uint8Array([0x30, 0x82, 1, 2]),
};

describe('takeover', () => {
  test("answers a TakeoverInit with a success the shepherd's initializer accepts: the init echoed, a 32-byte key", () => {
    const answer = takeover(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent)));
    expect(answer.ok).toBe(true);
    const { key, warnings } = parseTakeoverResponse(answer.response, sent);
    expect(key).toHaveLength(32);
    expect(warnings).toEqual([IN_PLACE_WARNING]);
    // Each takeover makes a key of its own.
    const again = takeover(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, sent)));
    expect(Buffer.from(parseTakeoverResponse(again.response, sent).key).equals(Buffer.from(key))).toBe(false);
  });

  test.each([
    [{ ...sent, machineId: '' }, 'TakeoverInit has no machine_id'],
    [{ ...sent, bmaasEndpoint: '' }, `TakeoverInit of machine ${sent.machineId} has no bmaas_endpoint`],
  ])('refuses an init without what it needs, saying so in a TakeoverError', (init, message) => {
    const answer = takeover(toBinary(TakeoverInitSchema, create(TakeoverInitSchema, init)));
    expect(answer).toMatchObject({ ok: false, message });
    expect(() => parseTakeoverResponse(answer.response, sent)).toThrow(AgentResponseError);
    expect(() => parseTakeoverResponse(answer.response, sent)).toThrow(`agent reported an error: ${message}`);
  });

  test('refuses bytes that are not a TakeoverInit', () => {
    const answer = takeover(Buffer.from([0xff, 0xff, 0xff]));
    expect(answer.ok).toBe(false);
    expect(() => parseTakeoverResponse(answer.response, sent)).toThrow(
      /agent reported an error: standard input \(3 bytes\) is not a TakeoverInit/,
    );
  });
});
