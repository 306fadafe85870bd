import type { DescMessage } from '@bufbuild/protobuf';
import { describe, expect, test } from 'vitest';
import { generatedAndCommitted } from '../../../test/support/proto.js';
import { DiskImageInstallationRequestSchema, RootDeviceHintsSchema } from '../src/gen/cloud/agent/api/disk_image_pb.js';

const shape = (schema: DescMessage) =>
  schema.fields.map((field) => [
    field.number,
    field.name,
    field.fieldKind === 'scalar' ? field.scalar : field.fieldKind,
  ]);

describe("the agent's generated API code", () => {
  test('matches what buf generates from proto/ now (run `npm run generate -w proto` if not)', async () => {
    const { fresh, committed } = await generatedAndCommitted('buf.gen.agent.yaml', 'packages/agent/src/gen');
    expect(fresh.size).toBeGreaterThan(0);
    expect([...committed.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [file, contents] of fresh) expect(committed.get(file), file).toBe(contents);
  });

  test("keeps this project's root device hints under their field numbers", () => {
    expect(shape(DiskImageInstallationRequestSchema).slice(5)).toEqual([
      [6, 'root_device_hints', 'message'],
      [7, 'hostname', 9],
      [8, 'ssh_public_keys', 'list'],
      [9, 'network_json', 9],
    ]);
    // ScalarType: 9 = string, 5 = int32, 8 = bool.
    expect(shape(RootDeviceHintsSchema)).toEqual([
      [1, 'device_name', 9],
      [2, 'model', 9],
      [3, 'vendor', 9],
      [4, 'serial_number', 9],
      [5, 'wwn', 9],
      [6, 'min_size_gigabytes', 5],
      [7, 'rotational', 8],
    ]);
  });
});
