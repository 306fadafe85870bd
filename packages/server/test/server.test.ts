/**
 * AgentCallback over real TLS and gRPC against a real BMDB: who may
 * heartbeat, what a heartbeat writes, and the server's certificate.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { type BMDB, Queries } from '@bmaas/bmdb-controlloop';
import { create, fromBinary } from '@bufbuild/protobuf';
import { Code, ConnectError } from '@connectrpc/connect';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, type TestDatabase } from '../../../test/support/database.js';
import {
  AgentHardwareReportSchema,
  BlockDevice_Protocol,
  BmaasServer,
  DiskImageInstallationRequest_Compression,
  EFISupport,
  HeartbeatRequestSchema,
  loadServerTls,
  NodeSchema,
  OSInstallationReportSchema,
  ServerTlsError,
  selfSignedServerTls,
} from '../src/index.js';
import { type AgentIdentity, agentClient, agentIdentity, currentAgentClient } from './helpers.js';

let db: TestDatabase;
let bmdb: BMDB;
let server: BmaasServer;
let dir: string;
let ca: string;
const registry = new Registry();

beforeAll(async () => {
  db = await createTestDatabase();
  bmdb = await openTestBMDB(db, { metrics: registry });
  dir = await mkdtemp(path.join(tmpdir(), 'bmaas-server-test-'));
  const tls = await selfSignedServerTls(dir);
  ca = tls.cert;
  server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls, metrics: registry });
});
afterAll(async () => {
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A machine whose agent started with `agent`'s key. */
async function startedMachine(agent: AgentIdentity): Promise<string> {
  const q = new Queries(bmdb.db);
  const machineId = await q.newMachine();
  await q.setAgentStarted(machineId, { publicKey: agent.publicKey });
  return machineId;
}

const written = async (machineId: string) => ({
  heartbeat: (await db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rowCount,
  hardware: (await db.admin('SELECT 1 FROM machine_hardware_report WHERE machine_id = $1', [machineId])).rowCount,
  installation: (await db.admin('SELECT 1 FROM machine_os_installation_report WHERE machine_id = $1', [machineId]))
    .rowCount,
});

const hardwareReport = create(AgentHardwareReportSchema, {
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
    const before = (await db.admin('SELECT now() AS now')).rows[0].now as Date;
    const response = await agentClient(server.port, ca, agent).heartbeat({
      machineId,
      hardwareReport,
      installationReport: { generation: 3n, result: { case: 'error', value: { error: 'disk on fire' } } },
    });
    expect(response.installationRequest).toBeUndefined();

    const q = new Queries(bmdb.db);
    const at = (
      await db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])
    ).rows[0]?.agent_heartbeat_at as Date;
    expect(at.getTime()).toBeGreaterThanOrEqual(before.getTime());
    const stored = await q.hardwareReport(machineId);
    expect(fromBinary(AgentHardwareReportSchema, stored?.raw ?? new Uint8Array())).toEqual(hardwareReport);
    // No request of generation 3 was ever made: its report is ignored.
    expect(await q.osInstallationReport(machineId)).toBeUndefined();
  });

  test('the machine’s pending installation request comes back in the answer, on both service names, until its report', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const q = new Queries(bmdb.db);
    await q.requestOSInstallation(machineId, {
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
    const old = await agentClient(server.port, ca, agent).heartbeat({ machineId });
    expect(old.installationRequest).toMatchObject(expected);
    expect(old.installationRequest?.$typeName).toBe('cloud.bmaas.server.api.OSInstallationRequest');
    expect((await q.osInstallation(machineId))?.state).toBe('Delivered');
    const current = await currentAgentClient(server.port, ca, agent).heartbeat({ machineId });
    expect(current.installationRequest).toMatchObject(expected);
    expect(current.installationRequest?.$typeName).toBe('cloud.agent.api.OSInstallationRequest');

    // The report of its generation, on the newer name: stored, the request settled, the answer empty.
    const reported = await currentAgentClient(server.port, ca, agent).heartbeat({
      machineId,
      installationReport: { generation: 1n, result: { case: 'error', value: { error: 'no such device /dev/vda' } } },
    });
    expect(reported.installationRequest).toBeUndefined();
    expect(await q.osInstallation(machineId)).toMatchObject({ state: 'Failed', error: 'no such device /dev/vda' });
    expect(await q.osInstallationReport(machineId)).toMatchObject({ generation: 1n, result: 'Error' });
    const raw = (await q.osInstallationReport(machineId))?.raw ?? new Uint8Array();
    expect(fromBinary(OSInstallationReportSchema, raw).result).toMatchObject({
      case: 'error',
      value: { error: 'no such device /dev/vda' },
    });
  });

  test('without a client certificate: UNAUTHENTICATED, nothing written', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(agentClient(server.port, ca).heartbeat({ machineId, hardwareReport }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with another agent’s key: UNAUTHENTICATED, nothing written', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(agentClient(server.port, ca, agentIdentity()).heartbeat({ machineId, hardwareReport }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect(error.rawMessage).toBe('machine id or public key unknown');
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with a certificate over a key that is not ed25519: UNAUTHENTICATED', async () => {
    const machineId = await startedMachine(agentIdentity());
    const error = await refusal(agentClient(server.port, ca, agentIdentity('ec')).heartbeat({ machineId }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('for an unknown machine: UNAUTHENTICATED, as for a wrong key', async () => {
    const error = await refusal(
      agentClient(server.port, ca, agentIdentity()).heartbeat({ machineId: '6f1c1c3e-0000-4000-8000-000000000001' }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(error.rawMessage).toBe('machine id or public key unknown');
  });

  test('for a machine without AgentStarted: UNAUTHENTICATED, nothing written', async () => {
    const agent = agentIdentity();
    const machineId = await new Queries(bmdb.db).newMachine();
    const error = await refusal(agentClient(server.port, ca, agent).heartbeat({ machineId, hardwareReport }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('with a malformed machine_id: INVALID_ARGUMENT naming it', async () => {
    const error = await refusal(
      agentClient(server.port, ca, agentIdentity()).heartbeat({ machineId: 'rack-7/slot-3' }),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe('machine_id "rack-7/slot-3" is not a UUID');
  });

  test('an installation report without a result: INVALID_ARGUMENT, nothing written', async () => {
    const agent = agentIdentity();
    const machineId = await startedMachine(agent);
    const error = await refusal(
      agentClient(server.port, ca, agent).heartbeat(
        create(HeartbeatRequestSchema, { machineId, installationReport: { generation: 1n } }),
      ),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(await written(machineId)).toEqual({ heartbeat: 0, hardware: 0, installation: 0 });
  });

  test('many agents at once, each on its own connection: all recorded, in fewer statements than heartbeats', async () => {
    const agents = Array.from({ length: 30 }, () => agentIdentity());
    const machines = await Promise.all(agents.map(startedMachine));
    const statements = async () =>
      Number(
        /bmdb_agent_heartbeat_batch_size_count (\d+)/.exec(
          await registry.getSingleMetricAsString('bmdb_agent_heartbeat_batch_size'),
        )?.[1],
      );
    const before = await statements();
    await Promise.all(
      agents.map((agent, i) => agentClient(server.port, ca, agent).heartbeat({ machineId: machines[i] })),
    );
    expect(await statements()).toBeLessThan(before + 30);
    const { rows } = await db.admin(
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
    const again = await selfSignedServerTls(dir);
    expect(again.created).toBe(false);
    expect(again.cert).toBe(ca);
    expect(again.certPath).toBe(path.join(dir, 'server.crt'));
    expect(await readFile(path.join(dir, 'server.crt'), 'utf8')).toBe(ca);
  });

  test('a missing file, a file that is no certificate, and a key of another certificate are named', async () => {
    const other = await mkdtemp(path.join(tmpdir(), 'bmaas-server-tls-'));
    try {
      const otherTls = await selfSignedServerTls(other);
      await expect(loadServerTls(path.join(other, 'nope.crt'), path.join(dir, 'server.key'))).rejects.toThrow(
        new ServerTlsError(path.join(other, 'nope.crt'), 'cannot read it (ENOENT)'),
      );
      await writeFile(path.join(other, 'junk.crt'), 'hello');
      await expect(loadServerTls(path.join(other, 'junk.crt'), path.join(dir, 'server.key'))).rejects.toThrow(
        /junk\.crt: not a PEM X\.509 certificate/,
      );
      await expect(loadServerTls(otherTls.certPath, path.join(dir, 'server.key'))).rejects.toThrow(
        `server TLS: ${path.join(dir, 'server.key')}: not the private key of the certificate ${otherTls.certPath}`,
      );
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });
});
