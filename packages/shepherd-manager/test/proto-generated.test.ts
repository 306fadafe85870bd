import { describe, expect, test } from 'vitest';
import { buf, generatedAndCommitted } from '../../../test/support/proto.js';
import {
  TakeoverErrorSchema,
  TakeoverInitSchema,
  TakeoverSuccessSchema,
} from '../src/gen/cloud/agent/api/takeover_pb.js';
import { TakeoverResponseSchema } from '../src/index.js';

describe('generated agent API code', () => {
  test('matches what buf generates from proto/ now (run `npm run generate -w proto` if not)', async () => {
    const { fresh, committed: current } = await generatedAndCommitted(
      'buf.gen.yaml',
      'packages/shepherd-manager/src/gen',
    );
    expect(fresh.size).toBeGreaterThan(0);
    expect([...current.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [file, contents] of fresh) expect(current.get(file), file).toBe(contents);
  });

  test('the .proto passes buf lint', async () => {
    await buf(['lint']);
  });

  test('keeps the original wire format: package, field numbers and types', () => {
    const shape = (
      schema:
        | typeof TakeoverInitSchema
        | typeof TakeoverSuccessSchema
        | typeof TakeoverErrorSchema
        | typeof TakeoverResponseSchema,
    ) =>
      schema.fields.map((field) => [
        field.number,
        field.name,
        field.fieldKind === 'scalar'
          ? field.scalar
          : field.fieldKind === 'message'
            ? field.message.typeName
            : field.fieldKind,
        field.fieldKind === 'list' ? 'repeated' : (field.oneof?.name ?? ''),
      ]);
    expect(TakeoverInitSchema.typeName).toBe('cloud.agent.api.TakeoverInit');
    // ScalarType: 9 = string, 12 = bytes.
    expect(shape(TakeoverInitSchema)).toEqual([
      [1, 'machine_id', 9, ''],
      [2, 'bmaas_endpoint', 9, ''],
      [3, 'ca_certificate', 12, ''],
    ]);
    expect(shape(TakeoverSuccessSchema)).toEqual([
      [1, 'init_message', 'cloud.agent.api.TakeoverInit', ''],
      [2, 'key', 12, ''],
      [3, 'warning', 'list', 'repeated'],
    ]);
    expect(shape(TakeoverErrorSchema)).toEqual([[1, 'message', 9, '']]);
    expect(shape(TakeoverResponseSchema)).toEqual([
      [1, 'success', 'cloud.agent.api.TakeoverSuccess', 'result'],
      [2, 'error', 'cloud.agent.api.TakeoverError', 'result'],
    ]);
  });
});
