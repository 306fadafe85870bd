/**
 * OS installation reports over real TLS and gRPC against a real BMDB: a
 * report whose answer was lost is answered again as the first was, and
 * every answer to a report says whether it was accepted or ignored
 * (`installation_report_outcome`, this project's field 100).
 */

import { OSInstallationReportOutcome as Outcome } from '@bmaas/api/cloud/agent/api/installation_report_outcome_pb';
import type { Database } from '@bmaas/bmdb-controlloop';
import { osInstallation, requestOSInstallation } from '@bmaas/bmdb-model';
import { Code, ConnectError } from '@connectrpc/connect';
import type { Kysely } from 'kysely';
import pg from 'pg';
import { Registry } from 'prom-client';
import { beforeAll, describe, expect, test } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { eventually } from '../../../test/support/wait.js';
import {
  type AgentIdentity,
  agentClient,
  agentIdentity,
  currentAgentClient,
  startedMachine,
  startTestServer,
  type TestServer,
} from './helpers.js';

let t: TestServer;
let q: Kysely<Database>;

beforeAll(async () => {
  t = await startTestServer(new Registry());
  q = t.bmdb.db;
});

/** A machine whose agent (`agent`) was handed a request of generation 1 and is installing it. */
async function installing(agent: AgentIdentity): Promise<string> {
  const machineId = await startedMachine(t.bmdb, agent);
  await requestOSInstallation(q, machineId, {
    imageUrl: 'https://images.example.com/debian.img',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/vda',
    actor: 'test',
    reason: 'server test',
  });
  const answer = await agentClient(t.server.port, t.ca, agent).heartbeat({ machineId });
  expect(answer.installationRequest?.generation).toBe(1n);
  return machineId;
}

const success = (machineId: string, generation: bigint) => ({
  machineId,
  installationReport: { generation, result: { case: 'success' as const, value: {} } },
});

describe('installation reports', () => {
  test('a Success report whose answer was lost (its deadline passed while the statement committed) is answered again as accepted', async () => {
    const agent = agentIdentity();
    const machineId = await installing(agent);
    // The statement waits on the machine's AgentStarted row while the call's deadline passes.
    const blocker = new pg.Client({ connectionString: t.db.url });
    await blocker.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [machineId]);
      const lost = agentClient(t.server.port, t.ca, agent).heartbeat(success(machineId, 1n), { timeoutMs: 200 });
      const error = await lost.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ConnectError);
      expect((error as ConnectError).code).toBe(Code.DeadlineExceeded);
      await eventually('the heartbeat statement waiting on the lock', async () => {
        const { rowCount } = await t.db.admin(
          `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rowCount ? true : undefined;
      });
      await blocker.query('COMMIT');
    } finally {
      await blocker.end();
    }
    // The statement committed after all: installed, the agent's tags gone.
    await eventually(async () => ((await osInstallation(q, machineId))?.state === 'Succeeded' ? true : undefined));
    // The agent, never told, sends it again, on either service name: answered as the first would have been.
    const again = await agentClient(t.server.port, t.ca, agent).heartbeat(success(machineId, 1n));
    expect(again.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED);
    expect(again.installationRequest).toBeUndefined();
    const current = await currentAgentClient(t.server.port, t.ca, agent).heartbeat(success(machineId, 1n));
    expect(current.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED);
    // Anyone else, or that agent without the report, is refused as before.
    const refused = await agentClient(t.server.port, t.ca, agent)
      .heartbeat({ machineId })
      .catch((e: unknown) => e);
    expect((refused as ConnectError).code).toBe(Code.Unauthenticated);
    const stranger = await agentClient(t.server.port, t.ca, agentIdentity())
      .heartbeat(success(machineId, 1n))
      .catch((e: unknown) => e);
    expect((stranger as ConnectError).code).toBe(Code.Unauthenticated);
    const { rows } = await t.db.admin(
      `SELECT (SELECT count(*) FROM machine_agent_started WHERE machine_id = $1)::int AS started,
              (SELECT count(*) FROM machine_agent_heartbeat WHERE machine_id = $1)::int AS heartbeats`,
      [machineId],
    );
    expect(rows[0]).toEqual({ started: 0, heartbeats: 0 });
  });

  test('a Success report of a generation replaced meanwhile is answered IGNORED, without the newer request; the next heartbeat gets it', async () => {
    const agent = agentIdentity();
    const machineId = await installing(agent);
    await requestOSInstallation(q, machineId, {
      imageUrl: 'https://images.example.com/newer.img',
      imageSha256: 'cd'.repeat(32),
      rootDevice: '/dev/vda',
      actor: 'test',
      reason: 'a newer image',
    });
    const client = currentAgentClient(t.server.port, t.ca, agent);
    const logged = captureDebugLog('bmaas:server:heartbeat');
    let ignored: Awaited<ReturnType<typeof client.heartbeat>>;
    try {
      ignored = await client.heartbeat(success(machineId, 1n));
    } finally {
      logged.restore();
    }
    // Its generation logged as a number (a bigint through %s would read `1n`).
    expect(logged.lines.join('\n')).toContain(
      `machine ${machineId} reported its installation of generation 1: success (ignored)`,
    );
    expect(ignored.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_IGNORED);
    expect(ignored.installationRequest).toBeUndefined();
    expect((await osInstallation(q, machineId))?.state).toBe('Requested');
    // Without a report: the newer request, and no outcome.
    const next = await client.heartbeat({ machineId });
    expect(next.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_UNSPECIFIED);
    expect(next.installationRequest?.generation).toBe(2n);
    expect(next.installationRequest?.type).toMatchObject({
      case: 'diskImage',
      value: { url: 'https://images.example.com/newer.img' },
    });
    const accepted = await client.heartbeat(success(machineId, 2n));
    expect(accepted.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED);
    expect(accepted.installationRequest).toBeUndefined();
    expect((await osInstallation(q, machineId))?.state).toBe('Succeeded');
  });

  test('an Error report of a replaced generation is IGNORED beside the request it keeps installing', async () => {
    const agent = agentIdentity();
    const machineId = await installing(agent);
    await requestOSInstallation(q, machineId, {
      imageUrl: 'https://images.example.com/newer.img',
      imageSha256: 'cd'.repeat(32),
      rootDevice: '/dev/vda',
      actor: 'test',
      reason: 'a newer image',
    });
    const answer = await agentClient(t.server.port, t.ca, agent).heartbeat({
      machineId,
      installationReport: { generation: 1n, result: { case: 'error', value: { error: 'stopped' } } },
    });
    expect(answer.installationReportOutcome).toBe(Outcome.OS_INSTALLATION_REPORT_OUTCOME_IGNORED);
    expect(answer.installationRequest?.generation).toBe(2n);
    expect((await osInstallation(q, machineId))?.state).toBe('Delivered');
  });
});

describe('root-device hints', () => {
  test('a request’s hints reach the agent as DiskImageInstallationRequest.root_device_hints; a path alone sends none', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(t.bmdb, agent);
    const image = { imageUrl: 'https://images.example.com/debian.img', imageSha256: 'ab'.repeat(32), actor: 'test' };
    await requestOSInstallation(q, machineId, {
      ...image,
      rootDeviceHints: {
        serialNumber: 'S3Z1NX0K',
        wwn: '0x5002538e40a1b2c3',
        deviceName: '/dev/disk/by-path/pci-0000:00:1f.2-ata-1',
        minSizeGigabytes: 100,
        rotational: false,
      },
      reason: 'by hints',
    });
    const client = currentAgentClient(t.server.port, t.ca, agent);
    const byHints = await client.heartbeat({ machineId });
    const request = byHints.installationRequest?.type;
    expect(request?.case).toBe('diskImage');
    const disk = request?.case === 'diskImage' ? request.value : undefined;
    expect(disk?.rootDevice).toBe('');
    expect(disk?.rootDeviceHints).toMatchObject({
      serialNumber: 'S3Z1NX0K',
      wwn: '0x5002538e40a1b2c3',
      deviceName: '/dev/disk/by-path/pci-0000:00:1f.2-ata-1',
      model: '',
      vendor: '',
      minSizeGigabytes: 100,
      rotational: false,
    });
    await requestOSInstallation(q, machineId, { ...image, rootDevice: '/dev/vda', reason: 'by path' });
    const byPath = (await client.heartbeat({ machineId })).installationRequest?.type;
    expect(byPath?.case).toBe('diskImage');
    expect(byPath?.case === 'diskImage' && byPath.value.rootDevice).toBe('/dev/vda');
    expect(byPath?.case === 'diskImage' && byPath.value.rootDeviceHints).toBeUndefined();
  });
});
