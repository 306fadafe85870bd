import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  TakeoverErrorSchema,
  TakeoverInitSchema,
  TakeoverResponseSchema,
  TakeoverSuccessSchema,
} from '../src/index.js';

const execFileAsync = promisify(execFile);
const root = fileURLToPath(new URL('../../../', import.meta.url));
const protoDir = path.join(root, 'proto');
const committed = path.join(root, 'packages/shepherd-manager/src/gen');
// As under `npm run generate -w proto`: buf and protoc-gen-es from the workspace.
const env = { ...process.env, PATH: `${path.join(root, 'node_modules/.bin')}${path.delimiter}${process.env.PATH}` };

let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'proto-generated-test-'));
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function filesUnder(dir: string): Promise<Map<string, string>> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  const files = new Map<string, string>();
  for (const entry of entries) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    files.set(path.relative(dir, file), await readFile(file, 'utf8'));
  }
  return files;
}

describe('generated agent API code', () => {
  test('matches what buf generates from proto/ now (run `npm run generate -w proto` if not)', async () => {
    // -o re-roots the template's `out` (../packages/shepherd-manager/src/gen) under scratch/, leaving the tree alone.
    await execFileAsync('buf', ['generate', '--template', 'buf.gen.yaml', '-o', path.join(scratch, 'proto')], {
      cwd: protoDir,
      env,
    });
    const fresh = await filesUnder(path.join(scratch, 'packages/shepherd-manager/src/gen'));
    const current = await filesUnder(committed);
    expect(fresh.size).toBeGreaterThan(0);
    expect([...current.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [file, contents] of fresh) expect(current.get(file), file).toBe(contents);
  });

  test('the .proto passes buf lint', async () => {
    await execFileAsync('buf', ['lint'], { cwd: protoDir, env });
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
