import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { DescMessage } from '@bufbuild/protobuf';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import {
  AgentCallback,
  AgentHardwareReportSchema,
  HeartbeatRequestSchema,
  HeartbeatResponseSchema,
  MetropolisInstallationRequestSchema,
  NodeSchema,
  OSInstallationReportSchema,
  OSInstallationRequestSchema,
} from '../src/index.js';

const execFileAsync = promisify(execFile);
const root = fileURLToPath(new URL('../../../', import.meta.url));
const protoDir = path.join(root, 'proto');
const committed = path.join(root, 'packages/server/src/gen');
const env = { ...process.env, PATH: `${path.join(root, 'node_modules/.bin')}${path.delimiter}${process.env.PATH}` };

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'server-proto-generated-test-'));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

async function filesUnder(dir: string): Promise<Map<string, string>> {
  const files = new Map<string, string>();
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    files.set(path.relative(dir, file), await readFile(file, 'utf8'));
  }
  return files;
}

/** Field number, name, type and oneof/repeated of each field, as the wire sees them. */
const shape = (schema: DescMessage) =>
  schema.fields.map((field) => [
    field.number,
    field.name,
    field.fieldKind === 'scalar'
      ? field.scalar
      : field.fieldKind === 'message'
        ? field.message.typeName
        : field.fieldKind === 'list'
          ? (field.message?.typeName ?? field.scalar)
          : field.fieldKind,
    field.fieldKind === 'list' ? 'repeated' : (field.oneof?.name ?? ''),
  ]);

describe('generated BMaaS server API code', () => {
  test('matches what buf generates from proto/ now (run `npm run generate -w proto` if not)', async () => {
    await execFileAsync('buf', ['generate', '--template', 'buf.gen.server.yaml', '-o', path.join(scratch, 'proto')], {
      cwd: protoDir,
      env,
    });
    const fresh = await filesUnder(path.join(scratch, 'packages/server/src/gen'));
    const current = await filesUnder(committed);
    expect(fresh.size).toBeGreaterThan(0);
    expect([...current.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [file, contents] of fresh) expect(current.get(file), file).toBe(contents);
  });

  test('keeps the upstream wire format: service, packages, field numbers and types', () => {
    expect(AgentCallback.typeName).toBe('cloud.bmaas.server.api.AgentCallback');
    expect(AgentCallback.method.heartbeat.name).toBe('Heartbeat');
    expect(AgentCallback.method.heartbeat.input.typeName).toBe('cloud.bmaas.server.api.HeartbeatRequest');
    expect(AgentCallback.method.heartbeat.output.typeName).toBe('cloud.bmaas.server.api.HeartbeatResponse');
    // ScalarType: 3 = int64, 9 = string, 8 = bool.
    expect(shape(HeartbeatRequestSchema)).toEqual([
      [1, 'machine_id', 9, ''],
      [2, 'hardware_report', 'cloud.bmaas.server.api.AgentHardwareReport', ''],
      [3, 'installation_report', 'cloud.bmaas.server.api.OSInstallationReport', ''],
    ]);
    expect(shape(HeartbeatResponseSchema)).toEqual([
      [1, 'installation_request', 'cloud.bmaas.server.api.OSInstallationRequest', ''],
    ]);
    expect(shape(AgentHardwareReportSchema)).toEqual([
      [1, 'report', 'cloud.agent.api.Node', ''],
      [2, 'warning', 9, 'repeated'],
    ]);
    expect(shape(OSInstallationReportSchema)).toEqual([
      [1, 'generation', 3, ''],
      [2, 'success', 'cloud.bmaas.server.api.OSInstallationReport.Success', 'result'],
      [3, 'error', 'cloud.bmaas.server.api.OSInstallationReport.Error', 'result'],
    ]);
    expect(shape(OSInstallationRequestSchema)).toEqual([
      [1, 'generation', 3, ''],
      [2, 'metropolis', 'cloud.bmaas.server.api.MetropolisInstallationRequest', 'type'],
    ]);
    expect(shape(MetropolisInstallationRequestSchema)).toEqual([[3, 'root_device', 9, '']]);
    expect(NodeSchema.typeName).toBe('cloud.agent.api.Node');
    expect(shape(NodeSchema).map(([number, name]) => [number, name])).toEqual([
      [1, 'manufacturer'],
      [2, 'product'],
      [3, 'serial_number'],
      [13, 'efi_support'],
      [8, 'memory_installed_bytes'],
      [9, 'memory_usable_ratio'],
      [10, 'cpu'],
      [11, 'block_device'],
      [12, 'network_interface'],
    ]);
  });
});
