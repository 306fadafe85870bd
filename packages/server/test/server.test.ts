/**
 * AgentCallback over real TLS and gRPC against a real BMDB: who may
 * heartbeat, what a heartbeat writes, and the server's certificate.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BlockDevice_Protocol, EFISupport, NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import {
  hardwareReport,
  machineDetail,
  newMachine,
  osInstallation,
  osInstallationReport,
  requestOSInstallation,
} from '@bmaas/bmdb-model';
import { create, fromBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, createClient } from '@connectrpc/connect';
import { createConnectTransport } from '@connectrpc/connect-node';
import { Registry } from 'prom-client';
import { beforeAll, describe, expect, test } from 'vitest';
import {
  AgentHardwareReportSchema,
  agentApi,
  DiskImageInstallationRequest_Compression,
  HeartbeatRequestSchema,
  loadServerTls,
  OSInstallationReportSchema,
  ServerTlsError,
  selfSignedServerTls,
} from '../src/index.js';
import {
  type AgentIdentity,
  agentClient,
  agentIdentity,
  currentAgentClient,
  heartbeatStatements,
  heartbeatsBehindAHeldOne,
  startedMachine as machineOf,
  startTestServer,
  type TestServer,
} from './helpers.js';

const registry = new Registry();
let t: TestServer;

beforeAll(async () => {
  t = await startTestServer(registry);
});

const startedMachine = (agent: AgentIdentity) => machineOf(t.bmdb, agent);

const written = async (machineId: string) => ({
  heartbeat: (await t.db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rowCount,
  hardware: (await t.db.admin('SELECT 1 FROM machine_hardware_report WHERE machine_id = $1', [machineId])).rowCount,
  installation: (await t.db.admin('SELECT 1 FROM machine_os_installation_report WHERE machine_id = $1', [machineId]))
    .rowCount,
});

const sentHardwareReport = create(AgentHardwareReportSchema, {
  report: create(NodeSchema, {
    manufacturer: 'Supermicro',
    product: 'AS-1114S',
    efiSupport: EFISupport.EFI_SUPPORT_ENABLED,
    memoryInstalledBytes: 256n * 2n ** 30n,
    blockDevice: [{ vendor: 'Samsung', capacityBytes: 2n ** 40n, protocol: BlockDevice_Protocol.NVME }],
  }),
  warning: ['no IPMI'],
});

/** The gRPC status of a call that must fail. */
async function refusal(call: Promise<unknown>): Promise<ConnectError> {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ConnectError);
  return error as ConnectError;
}

describe('Heartbeat', () => {
  test('from its machine’s agent: AgentHeartbeat at the database’s now, the hardware report stored, no installation request', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const before = (await t.db.admin('SELECT now() AS now')).rows[0].now as Date;
    const response = await agentClient(t.server.port, t.ca, agent).heartbeat({
      machineId,
      hardwareReport: sentHardwareReport,
      installationReport: { generation: 3n, result: { case: 'error', value: { error: 'disk on fire' } } },
    });
    expect(response.installationRequest).toBeUndefined();

    const q = t.bmdb.db;
    const at = (
      await t.db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])
    ).rows[0]?.agent_heartbeat_at as Date;
    expect(at.getTime()).toBeGreaterThanOrEqual(before.getTime());
    const stored = await hardwareReport(q, machineId);
    expect(fromBinary(AgentHardwareReportSchema, stored?.raw ?? new Uint8Array())).toEqual(sentHardwareReport);
    // No request of generation 3 was ever made: its report is ignored.
    expect(await osInstallationReport(q, machineId)).toBeUndefined();
  });

  test('the machine’s pending installation request comes back in the answer, on both service names, until its report', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const q = t.bmdb.db;
    await requestOSInstallation(q, machineId, {
      imageUrl: 'https://images.example.com/debian.img.gz',
      imageSha256: 'ab'.repeat(32),
      rootDevice: '/dev/vda',
      compression: 'gzip',
      userData: Buffer.from('#cloud-config\n'),
      actor: 'test',
      reason: 'server test',
    });
    const expected = {
      generation: 1n,
      type: {
        case: 'diskImage',
        value: {
          url: 'https://images.example.com/debian.img.gz',
          sha256: 'ab'.repeat(32),
          rootDevice: '/dev/vda',
          compression: DiskImageInstallationRequest_Compression.GZIP,
          userData: new Uint8Array(Buffer.from('#cloud-config\n')),
        },
      },
    };
    const old = await agentClient(t.server.port, t.ca, agent).heartbeat({ machineId });
    expect(old.installationRequest).toMatchObject(expected);
    expect(old.installationRequest?.$typeName).toBe('cloud.bmaas.server.api.OSInstallationRequest');
    expect((await osInstallation(q, machineId))?.state).toBe('Delivered');
    const current = await currentAgentClient(t.server.port, t.ca, agent).heartbeat({ machineId });
    expect(current.installationRequest).toMatchObject(expected);
    expect(current.installationRequest?.$typeName).toBe('cloud.agent.api.OSInstallationRequest');
    // The gRPC library's path (Connect, JSON) on the newer name answers the same.
    const connect = createClient(
      agentApi.AgentCallback,
      createConnectTransport({
        baseUrl: `https://localhost:${t.server.port}`,
        httpVersion: '2',
        useBinaryFormat: false,
        nodeOptions: { ca: t.ca, cert: agent.cert, key: agent.key },
      }),
    );
    expect((await connect.heartbeat({ machineId })).installationRequest).toMatchObject(expected);

    // The report of its generation, on the newer name: stored, the request settled, the answer empty.
    const reported = await currentAgentClient(t.server.port, t.ca, agent).heartbeat({
      machineId,
      installationReport: { generation: 1n, result: { case: 'error', value: { error: 'no such device /dev/vda' } } },
    });
    expect(reported.installationRequest).toBeUndefined();
    expect(await osInstallation(q, machineId)).toMatchObject({ state: 'Failed', error: 'no such device /dev/vda' });
    expect(await osInstallationReport(q, machineId)).toMatchObject({ generation: 1n, result: 'Error' });
    const raw = (await osInstallationReport(q, machineId))?.raw ?? new Uint8Array();
    expect(fromBinary(OSInstallationReportSchema, raw).result).toMatchObject({
      case: 'error',
      value: { error: 'no such device /dev/vda' },
    });
  });

  test('without a client certificate: UNAUTHENTICATED, nothing written', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(
      agentClient(t.server.port, t.ca).heartbeat({ machineId, hardwareReport: sentHardwareReport }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with another agent’s key: UNAUTHENTICATED, nothing written', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(
      agentClient(t.server.port, t.ca, agentIdentity()).heartbeat({ machineId, hardwareReport: sentHardwareReport }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(error.rawMessage).toBe('machine id or public key unknown');
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with a certificate over a key that is not ed25519: UNAUTHENTICATED', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(agentClient(t.server.port, t.ca, agentIdentity('ec')).heartbeat({ machineId }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('for an unknown machine: UNAUTHENTICATED, as for a wrong key', async () => {
    const error = await refusal(
      agentClient(t.server.port, t.ca, agentIdentity()).heartbeat({
        machineId: '6f1c1c3e-0000-4000-8000-000000000001',
      }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(error.rawMessage).toBe('machine id or public key unknown');
  });

  test('for a machine without AgentStarted: UNAUTHENTICATED, nothing written', async () => {
    const agent = agentIdentity();
    const machineId = await newMachine(t.bmdb.db);
    const error = await refusal(
      agentClient(t.server.port, t.ca, agent).heartbeat({ machineId, hardwareReport: sentHardwareReport }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with a malformed machine_id: INVALID_ARGUMENT naming it', async () => {
    const error = await refusal(
      agentClient(t.server.port, t.ca, agentIdentity()).heartbeat({ machineId: 'rack-7/slot-3' }),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe('machine_id "rack-7/slot-3" is not a UUID');
  });

  test('an installation report without a result: INVALID_ARGUMENT, nothing written', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const error = await refusal(
      agentClient(t.server.port, t.ca, agent).heartbeat(
        create(HeartbeatRequestSchema, { machineId, installationReport: { generation: 1n } }),
      ),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('the tail of the agent’s log is stored for the machine’s page; one over 64 KiB: INVALID_ARGUMENT, nothing written', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const client = agentClient(t.server.port, t.ca, agent);
    await client.heartbeat({ machineId, agentLog: { text: 'bmaas-init: starting the agent\n<b>x</b>\n' } });
    expect((await machineDetail(t.bmdb.db, machineId))?.agentLog?.text).toBe(
      'bmaas-init: starting the agent\n<b>x</b>\n',
    );

    const other = agentIdentity();
    const refused = await startedMachine(other);
    const error = await refusal(
      agentClient(t.server.port, t.ca, other).heartbeat({ machineId: refused, agentLog: { text: 'x'.repeat(65537) } }),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe(`agent_log of machine ${refused} has 65537 bytes, more than 65536`);
    expect(await written(refused)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('many agents at once, each on its own connection: all recorded, the 29 behind a statement in flight in one', async () => {
    const agents = Array.from({ length: 30 }, () => agentIdentity());
    // Made one after another: 30 concurrent serializable inserts outside a session's retries may fail with 40001.
    const fleet: { agent: AgentIdentity; machineId: string }[] = [];
    for (const agent of agents) fleet.push({ agent, machineId: await startedMachine(agent) });
    const machines = fleet.map(({ machineId }) => machineId);
    const before = await heartbeatStatements(registry);
    // The first heartbeat's statement held until the others are queued behind it: two statements, whatever the
    // machine's speed.
    const answers = await heartbeatsBehindAHeldOne(t, fleet);
    expect(answers.map((a) => a.grpcStatus)).toEqual(fleet.map(() => 0));
    expect(await heartbeatStatements(registry)).toBe(before + 2);
    const { rows } = await t.db.admin(
      'SELECT count(*)::int AS n FROM machine_agent_heartbeat WHERE machine_id = ANY($1)',
      [machines],
    );
    expect(rows[0].n).toBe(30);
  });

  test('requests are counted by status, with their latency', async () => {
    const text = await registry.metrics();
    expect(text).toMatch(/bmaas_server_requests_total\{method="Heartbeat",code="ok"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_requests_total\{method="Heartbeat",code="unauthenticated"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_requests_total\{method="Heartbeat",code="invalid_argument"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_request_duration_seconds_count\{method="Heartbeat"\} [1-9]/);
  });
});

describe('server TLS', () => {
  test('the self-signed certificate is made once under the directory and reused', async () => {
    const again = await selfSignedServerTls(t.dir);
    expect(again.created).toBe(false);
    expect(again.cert).toBe(t.ca);
    expect(again.certPath).toBe(path.join(t.dir, 'server.crt'));
    expect(await readFile(path.join(t.dir, 'server.crt'), 'utf8')).toBe(t.ca);
  });

  test('a missing file, a file that is no certificate, and a key of another certificate are named', async () => {
    const other = await mkdtemp(path.join(tmpdir(), 'bmaas-server-tls-'));
    try {
      const otherTls = await selfSignedServerTls(other);
      await expect(loadServerTls(path.join(other, 'nope.crt'), path.join(t.dir, 'server.key'))).rejects.toThrow(
        new ServerTlsError(path.join(other, 'nope.crt'), 'cannot read it (ENOENT)'),
      );
      await writeFile(path.join(other, 'junk.crt'), 'hello');
      await expect(loadServerTls(path.join(other, 'junk.crt'), path.join(t.dir, 'server.key'))).rejects.toThrow(
        /junk\.crt: not a PEM X\.509 certificate/,
      );
      await expect(loadServerTls(otherTls.certPath, path.join(t.dir, 'server.key'))).rejects.toThrow(
        `server TLS: ${path.join(t.dir, 'server.key')}: not the private key of the certificate ${otherTls.certPath}`,
      );
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });
});
