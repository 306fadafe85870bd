import type { DescMessage } from '@bufbuild/protobuf';
import { describe, expect, test } from 'vitest';
import * as agentApi from '../src/gen/cloud/agent/api/agent_pb.js';
import { DiskImageInstallationRequestSchema, RootDeviceHintsSchema } from '../src/gen/cloud/agent/api/disk_image_pb.js';
import { NodeSchema } from '../src/gen/cloud/agent/api/hwreport_pb.js';
import {
  TakeoverErrorSchema,
  TakeoverInitSchema,
  TakeoverResponseSchema,
  TakeoverSuccessSchema,
} from '../src/gen/cloud/agent/api/takeover_pb.js';
import {
  AgentCallback,
  AgentHardwareReportSchema,
  HeartbeatRequestSchema,
  HeartbeatResponseSchema,
  MetropolisInstallationRequestSchema,
  OSInstallationReport_SuccessSchema,
  OSInstallationReportSchema,
  OSInstallationRequestSchema,
} from '../src/gen/cloud/bmaas/server/api/agent_pb.js';
import {
  AgentEnrollment,
  EnrollRequestSchema,
  EnrollResponseSchema,
} from '../src/gen/cloud/bmaas/server/api/enrollment_pb.js';

/**
 * Field number, name, type (ScalarType's number, or the message's name) and
 * oneof or `repeated` of each field, as the wire sees them.
 */
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

describe('the generated API keeps the wire format', () => {
  test('the takeover: package, field numbers and types', () => {
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
      [3, 'warning', 9, 'repeated'],
    ]);
    expect(shape(TakeoverErrorSchema)).toEqual([[1, 'message', 9, '']]);
    expect(shape(TakeoverResponseSchema)).toEqual([
      [1, 'success', 'cloud.agent.api.TakeoverSuccess', 'result'],
      [2, 'error', 'cloud.agent.api.TakeoverError', 'result'],
    ]);
  });

  test('the agent callback: service, packages, field numbers and types, under both names', () => {
    expect(AgentCallback.typeName).toBe('cloud.bmaas.server.api.AgentCallback');
    expect(AgentCallback.method.heartbeat.name).toBe('Heartbeat');
    expect(AgentCallback.method.heartbeat.input.typeName).toBe('cloud.bmaas.server.api.HeartbeatRequest');
    expect(AgentCallback.method.heartbeat.output.typeName).toBe('cloud.bmaas.server.api.HeartbeatResponse');
    // ScalarType: 3 = int64, 9 = string, 8 = bool.
    expect(shape(HeartbeatRequestSchema)).toEqual([
      [1, 'machine_id', 9, ''],
      [2, 'hardware_report', 'cloud.bmaas.server.api.AgentHardwareReport', ''],
      [3, 'installation_report', 'cloud.bmaas.server.api.OSInstallationReport', ''],
      [100, 'agent_log', 'cloud.agent.api.AgentLog', ''],
    ]);
    expect(shape(HeartbeatResponseSchema)).toEqual([
      [1, 'installation_request', 'cloud.bmaas.server.api.OSInstallationRequest', ''],
      [100, 'installation_report_outcome', 'enum', ''],
    ]);
    expect(HeartbeatResponseSchema.fields[1]?.enum?.typeName).toBe('cloud.agent.api.OSInstallationReportOutcome');
    expect(HeartbeatResponseSchema.fields[1]?.enum?.values.map((v) => [v.number, v.name])).toEqual([
      [0, 'OS_INSTALLATION_REPORT_OUTCOME_UNSPECIFIED'],
      [1, 'OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED'],
      [2, 'OS_INSTALLATION_REPORT_OUTCOME_IGNORED'],
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
      [100, 'disk_image', 'cloud.agent.api.DiskImageInstallationRequest', 'type'],
      [101, 'disk_wipe', 'cloud.agent.api.DiskWipeRequest', 'type'],
    ]);
    expect(shape(DiskImageInstallationRequestSchema)).toEqual([
      [1, 'url', 9, ''],
      [2, 'sha256', 9, ''],
      [3, 'root_device', 9, ''],
      [4, 'compression', 'enum', ''],
      [5, 'user_data', 12, ''],
      [6, 'root_device_hints', 'cloud.agent.api.RootDeviceHints', ''],
      [7, 'hostname', 9, ''],
      [8, 'ssh_public_keys', 9, 'repeated'],
      [9, 'network_json', 9, ''],
    ]);
    // This project's root device hints, under their field numbers.
    expect(shape(RootDeviceHintsSchema)).toEqual([
      [1, 'device_name', 9, ''],
      [2, 'model', 9, ''],
      [3, 'vendor', 9, ''],
      [4, 'serial_number', 9, ''],
      [5, 'wwn', 9, ''],
      [6, 'min_size_gigabytes', 5, ''],
      [7, 'rotational', 8, ''],
    ]);
    // This project's extension of upstream's empty Success, under a number upstream never used.
    expect(shape(OSInstallationReport_SuccessSchema)).toEqual([[100, 'boot_secret_sha256', 12, '']]);
    expect(shape(MetropolisInstallationRequestSchema)).toEqual([[3, 'root_device', 9, '']]);
    expect(NodeSchema.typeName).toBe('cloud.agent.api.Node');
    // The same API under the current upstream agent's names (cloud/agent/api/agent.proto).
    expect(agentApi.AgentCallback.typeName).toBe('cloud.agent.api.AgentCallback');
    expect(agentApi.AgentCallback.method.heartbeat.input.typeName).toBe('cloud.agent.api.HeartbeatRequest');
    const renamed = (rows: unknown[][]) =>
      JSON.stringify(rows).replaceAll('cloud.bmaas.server.api.', 'cloud.agent.api.');
    for (const [older, newer] of [
      [HeartbeatRequestSchema, agentApi.HeartbeatRequestSchema],
      [HeartbeatResponseSchema, agentApi.HeartbeatResponseSchema],
      [AgentHardwareReportSchema, agentApi.AgentHardwareReportSchema],
      [OSInstallationReportSchema, agentApi.OSInstallationReportSchema],
      [OSInstallationRequestSchema, agentApi.OSInstallationRequestSchema],
      [MetropolisInstallationRequestSchema, agentApi.MetropolisInstallationRequestSchema],
    ] as const) {
      expect(JSON.stringify(shape(newer)), newer.typeName).toBe(renamed(shape(older)));
    }
    expect(shape(agentApi.AgentInitSchema)).toEqual([
      [1, 'takeover_init', 'cloud.agent.api.TakeoverInit', ''],
      [2, 'private_key', 12, ''],
    ]);
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

  test("AgentEnrollment, this project's extension: its service, method and fields", () => {
    expect(AgentEnrollment.typeName).toBe('cloud.bmaas.server.api.AgentEnrollment');
    expect(AgentEnrollment.method.enroll.name).toBe('Enroll');
    expect(AgentEnrollment.method.enroll.input.typeName).toBe('cloud.bmaas.server.api.EnrollRequest');
    expect(AgentEnrollment.method.enroll.output.typeName).toBe('cloud.bmaas.server.api.EnrollResponse');
    expect(shape(EnrollRequestSchema)).toEqual([
      [1, 'machine_id', 9, ''],
      [2, 'token', 9, ''],
      [3, 'hardware_report', 'cloud.bmaas.server.api.AgentHardwareReport', ''],
    ]);
    expect(shape(EnrollResponseSchema)).toEqual([]);
  });
});
