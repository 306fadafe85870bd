/**
 * AgentEnrollment.Enroll over real TLS against a real BMDB: a BMC-booted
 * agent presents its machine's one-time token, and its client
 * certificate's key becomes the machine's agent key, whose heartbeats are
 * then accepted; refusals name the machine and why, never the token.
 */

import { NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { agentEnrollment, hardwareReport, issueEnrollmentToken, newMachine, operatorHistory } from '@bmaas/bmdb-model';
import { create, fromBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, createClient } from '@connectrpc/connect';
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from '@connectrpc/connect-node';
import { Registry } from 'prom-client';
import { beforeAll, describe, expect, test } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { AgentEnrollment, AgentHardwareReportSchema } from '../src/index.js';
import { type AgentIdentity, agentClient, agentIdentity, startTestServer, type TestServer } from './helpers.js';

const registry = new Registry();
let t: TestServer;

beforeAll(async () => {
  t = await startTestServer(registry);
});

/** A gRPC client of AgentEnrollment (the lean path), presenting `identity` if any. */
function enrollmentClient(identity?: AgentIdentity) {
  return createClient(
    AgentEnrollment,
    createGrpcTransport({
      baseUrl: `https://localhost:${t.server.port}`,
      nodeOptions: { ca: t.ca, ...(identity && { cert: identity.cert, key: identity.key }) },
    }),
  );
}

async function refusal(call: Promise<unknown>): Promise<ConnectError> {
  const error = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ConnectError);
  return error as ConnectError;
}

/** A machine with a token issued, good for ten minutes. */
async function machineWithToken(): Promise<{ machineId: string; token: string }> {
  const machineId = await newMachine(t.bmdb.db);
  const issued = await issueEnrollmentToken(t.bmdb.db, machineId, { validForSeconds: 600 });
  return { machineId, token: issued.token.reveal() };
}

async function agentKey(machineId: string): Promise<Uint8Array | undefined> {
  const { rows } = await t.db.admin('SELECT agent_public_key FROM machine_agent_started WHERE machine_id = $1', [
    machineId,
  ]);
  return rows[0] && new Uint8Array(rows[0].agent_public_key);
}

const sentHardwareReport = create(AgentHardwareReportSchema, {
  report: create(NodeSchema, { manufacturer: 'Supermicro', memoryInstalledBytes: 64n * 2n ** 30n }),
});

describe('Enroll', () => {
  test('with its token: the certificate’s key is the agent’s, the hardware report stored, and that key’s heartbeats accepted', async () => {
    const agent = agentIdentity();
    const { machineId, token } = await machineWithToken();
    const logged = captureDebugLog('bmaas:server*');
    try {
      await enrollmentClient(agent).enroll({ machineId, token, hardwareReport: sentHardwareReport });
    } finally {
      logged.restore();
    }
    expect(await agentKey(machineId)).toEqual(agent.publicKey);
    const stored = await hardwareReport(t.bmdb.db, machineId);
    expect(fromBinary(AgentHardwareReportSchema, stored?.raw ?? new Uint8Array())).toEqual(sentHardwareReport);
    expect((await agentEnrollment(t.bmdb.db, machineId))?.enrolledAt).toBeInstanceOf(Date);
    expect(logged.lines.join('\n')).toContain(`enrolled the agent of machine ${machineId}`);
    expect(logged.lines.join('\n')).not.toContain(token);

    await agentClient(t.server.port, t.ca, agent).heartbeat({ machineId });
    const other = await refusal(agentClient(t.server.port, t.ca, agentIdentity()).heartbeat({ machineId }));
    expect(other.code).toBe(Code.Unauthenticated);
  });

  test('a wrong, reused or expired token: PERMISSION_DENIED naming the machine and why, never the token; recorded', async () => {
    const agent = agentIdentity();
    const { machineId, token } = await machineWithToken();
    const logged = captureDebugLog('bmaas:server*');
    const client = enrollmentClient(agent);
    const wrong = await refusal(client.enroll({ machineId, token: `${token}x` }));
    await client.enroll({ machineId, token });
    const used = await refusal(enrollmentClient(agentIdentity()).enroll({ machineId, token }));
    const expiring = await machineWithToken();
    await t.db.admin(
      `UPDATE machine_agent_enrollment SET issued_at = now() - interval '1 hour', expires_at = now() - interval '1 second'
       WHERE machine_id = $1`,
      [expiring.machineId],
    );
    const expired = await refusal(client.enroll({ machineId: expiring.machineId, token: expiring.token }));
    const unissued = await newMachine(t.bmdb.db);
    const none = await refusal(client.enroll({ machineId: unissued, token }));
    logged.restore();

    for (const error of [wrong, used, expired, none]) expect(error.code).toBe(Code.PermissionDenied);
    expect(wrong.rawMessage).toBe(
      `enrollment of machine ${machineId} refused: the enrollment token is not the one issued for it`,
    );
    expect(used.rawMessage).toBe(`enrollment of machine ${machineId} refused: its enrollment token was used already`);
    expect(expired.rawMessage).toBe(
      `enrollment of machine ${expiring.machineId} refused: its enrollment token expired`,
    );
    expect(none.rawMessage).toBe(`enrollment of machine ${unissued} refused: no enrollment token was issued for it`);
    // The first agent stays the machine's.
    expect(await agentKey(machineId)).toEqual(agent.publicKey);
    expect(await agentKey(expiring.machineId)).toBeUndefined();
    const history = (await operatorHistory(t.bmdb.db, machineId)).map((e) => [e.action, e.outcome, e.detail]);
    expect(history).toEqual([
      ['EnrollAgent', 'Refused', { reason: 'WrongToken' }],
      ['EnrollAgent', 'Succeeded', { agentPublicKey: Buffer.from(agent.publicKey).toString('hex') }],
      ['EnrollAgent', 'Refused', { reason: 'Used' }],
    ]);
    const log = logged.lines.join('\n');
    expect(log).toContain(`enrollment of machine ${machineId} refused`);
    for (const secret of [token, expiring.token]) expect(log).not.toContain(secret);
  });

  test('its token again with the key it enrolled (the answer lost): OK as the first, counted Repeated, nothing written', async () => {
    const agent = agentIdentity();
    const { machineId, token } = await machineWithToken();
    const repeats = async () =>
      Number(
        /bmaas_server_enrollments_total\{result="Repeated"\} (\d+)/.exec(
          await registry.getSingleMetricAsString('bmaas_server_enrollments_total'),
        )?.[1] ?? 0,
      );
    const before = await repeats();
    await enrollmentClient(agent).enroll({ machineId, token, hardwareReport: sentHardwareReport });
    // The agent asks again over a new connection, with its key and token, as after an answer that never came.
    const logged = captureDebugLog('bmaas:server*');
    try {
      await enrollmentClient(agent).enroll({ machineId, token, hardwareReport: sentHardwareReport });
    } finally {
      logged.restore();
    }
    expect(await repeats()).toBe(before + 1);
    expect(logged.lines.join('\n')).toContain(`enrolled the agent of machine ${machineId}`);
    expect(logged.lines.join('\n')).not.toContain(token);
    expect(await agentKey(machineId)).toEqual(agent.publicKey);
    expect((await operatorHistory(t.bmdb.db, machineId)).map((e) => e.outcome)).toEqual(['Succeeded']);
    await agentClient(t.server.port, t.ca, agent).heartbeat({ machineId });
    // Another key with the used token is still refused.
    const other = await refusal(enrollmentClient(agentIdentity()).enroll({ machineId, token }));
    expect(other.code).toBe(Code.PermissionDenied);
    expect(other.rawMessage).toBe(`enrollment of machine ${machineId} refused: its enrollment token was used already`);
  });

  test('without a client certificate: UNAUTHENTICATED, the token left unused', async () => {
    const { machineId, token } = await machineWithToken();
    const error = await refusal(enrollmentClient().enroll({ machineId, token }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect((await agentEnrollment(t.bmdb.db, machineId))?.enrolledAt).toBeUndefined();
  });

  test('without a client certificate through the gRPC library (Connect): UNAUTHENTICATED, counted as Enroll', async () => {
    const { machineId, token } = await machineWithToken();
    const client = createClient(
      AgentEnrollment,
      createConnectTransport({
        baseUrl: `https://localhost:${t.server.port}`,
        httpVersion: '2',
        nodeOptions: { ca: t.ca },
      }),
    );
    const refusals = async () => {
      const text = await registry.getSingleMetricAsString('bmaas_server_requests_total');
      return Number(/bmaas_server_requests_total\{method="Enroll",code="unauthenticated"\} (\d+)/.exec(text)?.[1] ?? 0);
    };
    const before = await refusals();
    const error = await refusal(client.enroll({ machineId, token }));
    expect(error.code).toBe(Code.Unauthenticated);
    expect((await agentEnrollment(t.bmdb.db, machineId))?.enrolledAt).toBeUndefined();
    expect(await refusals()).toBe(before + 1);
  });

  test('a malformed machine_id: INVALID_ARGUMENT naming it', async () => {
    const error = await refusal(enrollmentClient(agentIdentity()).enroll({ machineId: 'nope', token: 'x' }));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe('machine_id "nope" is not a UUID');
  });

  test('Connect and gRPC-Web (HTTP/2 and HTTP/1.1), through the gRPC library: enrolled, refusals with their code', async () => {
    const transports = { connect: createConnectTransport, grpcWeb: createGrpcWebTransport };
    for (const [name, transport] of Object.entries(transports)) {
      for (const httpVersion of ['2', '1.1'] as const) {
        const agent = agentIdentity();
        const { machineId, token } = await machineWithToken();
        const client = createClient(
          AgentEnrollment,
          transport({
            baseUrl: `https://localhost:${t.server.port}`,
            httpVersion,
            nodeOptions: { ca: t.ca, cert: agent.cert, key: agent.key },
          }),
        );
        const wrong = await refusal(client.enroll({ machineId, token: 'not-it' }));
        expect(wrong.code, `${name} over HTTP/${httpVersion}`).toBe(Code.PermissionDenied);
        expect(wrong.rawMessage).toContain(`enrollment of machine ${machineId} refused`);
        await client.enroll({ machineId, token });
        expect(await agentKey(machineId), `${name} over HTTP/${httpVersion}`).toEqual(agent.publicKey);
      }
    }
  });

  test('enrollments are counted by result, and as requests by status', async () => {
    const text = await registry.metrics();
    expect(text).toMatch(/bmaas_server_enrollments_total\{result="Enrolled"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_enrollments_total\{result="WrongToken"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_enrollments_total\{result="Used"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_enrollments_total\{result="Expired"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_enrollments_total\{result="NoToken"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_requests_total\{method="Enroll",code="permission_denied"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_requests_total\{method="Enroll",code="ok"\} [1-9]/);
    expect(text).toMatch(/bmaas_server_request_duration_seconds_count\{method="Enroll"\} [1-9]/);
  });
});
