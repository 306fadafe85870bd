/**
 * What the server promises on the wire, proved with clients that share no
 * code with it, over real TLS against a real BMDB: @grpc/grpc-js (the
 * service loaded from the .proto by @grpc/proto-loader), connect's own
 * clients for Connect and gRPC-Web, and a raw node:http2 client for what no
 * library sends. Status codes, messages and trailers; deadlines; message
 * size limits; compression; broken frames; a slow client; what the gRPC
 * library still serves; authentication, batching and metrics.
 */

import { constants } from 'node:http2';
import { connect } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { gzipSync } from 'node:zlib';
import { create, toBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, createClient } from '@connectrpc/connect';
import { createConnectTransport, createGrpcWebTransport } from '@connectrpc/connect-node';
import { status } from '@grpc/grpc-js';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { eventually } from '../../../test/support/wait.js';
import {
  AgentCallback,
  BmaasServer,
  BmaasServerError,
  type BmaasServerOptions,
  HeartbeatRequestSchema,
  HeartbeatResponseSchema,
  selfSignedServerTls,
} from '../src/index.js';
import {
  type AgentIdentity,
  agentIdentity,
  heartbeatStatements,
  heartbeatsBehindAHeldOne,
  startedMachine as machineOf,
  startTestServer,
  type TestServer,
} from './helpers.js';
import { GrpcJsAgent, grpcFrame, type RawAnswer, RawGrpcClient } from './standard-clients.js';

const registry = new Registry();
let t: TestServer;
const closing: { close(): void }[] = [];

beforeAll(async () => {
  t = await startTestServer(registry);
});
afterAll(() => {
  for (const client of closing) client.close();
});

const startedMachine = (agent: AgentIdentity) => machineOf(t.bmdb, agent);

/** An agent with its machine. */
async function agentWithMachine(): Promise<{ agent: AgentIdentity; machineId: string }> {
  const agent = agentIdentity();
  return { agent, machineId: await startedMachine(agent) };
}

function grpcJs(identity?: AgentIdentity, options?: ConstructorParameters<typeof GrpcJsAgent>[3]): GrpcJsAgent {
  const client = new GrpcJsAgent(t.server.port, t.ca, identity, options);
  closing.push(client);
  return client;
}

function raw(identity?: AgentIdentity): RawGrpcClient {
  const client = new RawGrpcClient(t.server.port, t.ca, identity);
  closing.push(client);
  return client;
}

/** A HeartbeatRequest as one gRPC message. */
function heartbeatMessage(machineId: string): Uint8Array {
  return toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { machineId }));
}

async function heartbeatRecorded(machineId: string): Promise<boolean> {
  const { rowCount } = await t.db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId]);
  return rowCount === 1;
}

/** `bmaas_server_requests_total` by code, and the duration histogram's count, of Heartbeat. */
async function counted(): Promise<{ codes: Record<string, number>; durations: number }> {
  const text = await registry.metrics();
  const codes: Record<string, number> = {};
  for (const [, code, value] of text.matchAll(
    /bmaas_server_requests_total\{method="Heartbeat",code="(\w+)"\} (\d+)/g,
  )) {
    codes[code as string] = Number(value);
  }
  const durations = Number(
    /bmaas_server_request_duration_seconds_count\{method="Heartbeat"\} (\d+)/.exec(text)?.[1] ?? 0,
  );
  return { codes, durations };
}

describe('status codes, messages and trailers (@grpc/grpc-js)', () => {
  test('a heartbeat is answered OK: headers, one empty HeartbeatResponse, then grpc-status 0 in the trailers', async () => {
    const { agent, machineId } = await agentWithMachine();
    const answer = await grpcJs(agent).heartbeat({ machineId });
    expect(answer.status.code).toBe(status.OK);
    expect(answer.response).toEqual({});
    expect(await heartbeatRecorded(machineId)).toBe(true);

    const wire = await raw(agent).call(grpcFrame(heartbeatMessage(machineId)));
    expect(wire.headers[':status']).toBe(200);
    expect(wire.headers['content-type']).toMatch(/^application\/grpc(\+proto)?$/);
    expect(wire.headers['grpc-status']).toBeUndefined();
    expect(wire.body).toEqual(grpcFrame(toBinary(HeartbeatResponseSchema, create(HeartbeatResponseSchema))));
    expect(wire.trailers?.['grpc-status']).toBe('0');
  });

  test('refusals: UNAUTHENTICATED without a certificate or with another key, the same message for every unknown', async () => {
    const { machineId } = await agentWithMachine();
    const withoutCertificate = await grpcJs().heartbeat({ machineId });
    expect(withoutCertificate.status.code).toBe(status.UNAUTHENTICATED);
    expect(withoutCertificate.status.details).toBe(
      'machine id or public key unknown: no client certificate over an ed25519 key',
    );
    const otherKey = await grpcJs(agentIdentity()).heartbeat({ machineId });
    expect(otherKey.status.code).toBe(status.UNAUTHENTICATED);
    expect(otherKey.status.details).toBe('machine id or public key unknown');
    const ecKey = await grpcJs(agentIdentity('ec')).heartbeat({ machineId });
    expect(ecKey.status.code).toBe(status.UNAUTHENTICATED);
    const unknownMachine = await grpcJs(agentIdentity()).heartbeat({
      machineId: '6f1c1c3e-0000-4000-8000-000000000002',
    });
    expect(unknownMachine.status).toMatchObject({
      code: status.UNAUTHENTICATED,
      details: 'machine id or public key unknown',
    });
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('grpc-message is percent-encoded as the spec says, so every client reads it back whole', async () => {
    const machineId = 'rack 7/slot%3 — ü';
    const expected = `machine_id "${machineId}" is not a UUID`;
    const answer = await grpcJs(agentIdentity()).heartbeat({ machineId });
    expect(answer.status).toMatchObject({ code: status.INVALID_ARGUMENT, details: expected });

    const wire = await raw(agentIdentity()).call(grpcFrame(heartbeatMessage(machineId)));
    const message = (wire.trailers ?? wire.headers)['grpc-message'];
    // Printable ASCII stays as it is; '%' and everything else are %XX of UTF-8.
    expect(message).toBe('machine_id "rack 7/slot%253 %E2%80%94 %C3%BC" is not a UUID');
    expect(wire.grpcMessage).toBe(expected);

    const agent = agentIdentity();
    const connectError = await createClient(
      AgentCallback,
      createConnectTransport({
        baseUrl: `https://localhost:${t.server.port}`,
        httpVersion: '2',
        nodeOptions: { ca: t.ca, cert: agent.cert, key: agent.key },
      }),
    )
      .heartbeat({ machineId })
      .catch((e: unknown) => e);
    expect(connectError).toBeInstanceOf(ConnectError);
    expect((connectError as ConnectError).rawMessage).toBe(expected);
  });

  test('an error answer ends the call with its status, without a message', async () => {
    const wire = await raw(agentIdentity()).call(grpcFrame(heartbeatMessage('not-a-uuid')));
    expect(wire.headers[':status']).toBe(200);
    expect(wire.body.length).toBe(0);
    expect(wire.grpcStatus).toBe(Code.InvalidArgument);
  });

  test('the BMDB unreachable: UNAVAILABLE naming the machine; the agent tries again', async () => {
    const ownDb = await createTestDatabase();
    const closed = await openTestBMDB(ownDb);
    const own = await BmaasServer.start({
      bmdb: closed,
      listen: { host: '127.0.0.1', port: 0 },
      tls: { cert: t.ca, key: await serverKey() },
    });
    try {
      await closed.close();
      const client = new GrpcJsAgent(own.port, t.ca, agentIdentity());
      closing.push(client);
      const machineId = '6f1c1c3e-0000-4000-8000-000000000003';
      const answer = await client.heartbeat({ machineId });
      expect(answer.status).toMatchObject({
        code: status.UNAVAILABLE,
        details: `could not record the heartbeat of machine ${machineId}`,
      });
    } finally {
      await own.close();
    }
  });
});

test('close ends, past its grace, connections that never became HTTP/2 connections (a handshake never begun)', async () => {
  const own = await BmaasServer.start({
    bmdb: t.bmdb,
    listen: { host: '127.0.0.1', port: 0 },
    tls: { cert: t.ca, key: await serverKey() },
  });
  // A TCP connection that sends nothing: no TLS handshake, so no session, yet the listener waits for it.
  const silent = connect(own.port, '127.0.0.1');
  await new Promise<void>((resolve, reject) => silent.once('connect', resolve).once('error', reject));
  const socketClosed = new Promise<void>((resolve) => silent.once('close', () => resolve()));
  silent.on('error', () => {});
  let closed = false;
  const closing = own.close(50).then(() => {
    closed = true;
  });
  await eventually('the server closed with the silent connection still open', async () => closed || undefined, 10_000);
  await closing;
  await socketClosed;
});

async function serverKey(): Promise<string> {
  return (await selfSignedServerTls(t.dir)).key;
}

describe('deadlines (grpc-timeout)', () => {
  test('a heartbeat still unanswered at its deadline is answered DEADLINE_EXCEEDED then', async () => {
    const { agent, machineId } = await agentWithMachine();
    // Hold the machine's AgentStarted row: the heartbeat's statement waits for it.
    const blocker = new pg.Client({ connectionString: t.db.url });
    await blocker.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [machineId]);
      const wire = await raw(agent).call(grpcFrame(heartbeatMessage(machineId)), { 'grpc-timeout': '300m' });
      expect(wire.grpcStatus).toBe(Code.DeadlineExceeded);
      const answer = await grpcJs(agent).heartbeat({ machineId }, { deadline: Date.now() + 300 });
      expect(answer.status.code).toBe(status.DEADLINE_EXCEEDED);
    } finally {
      await blocker.query('ROLLBACK');
      await blocker.end();
    }
    // Within its deadline, it is answered as ever.
    const answer = await grpcJs(agent).heartbeat({ machineId }, { deadline: Date.now() + 60_000 });
    expect(answer.status.code).toBe(status.OK);
  });

  test('a grpc-timeout that is not one: INVALID_ARGUMENT naming it, nothing written', async () => {
    const { agent, machineId } = await agentWithMachine();
    const client = raw(agent);
    for (const timeout of ['1.5S', '123456789S', '10s', 'soon']) {
      const wire = await client.call(grpcFrame(heartbeatMessage(machineId)), { 'grpc-timeout': timeout });
      expect(wire.grpcStatus).toBe(Code.InvalidArgument);
      expect(wire.grpcMessage).toContain(timeout);
    }
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });
});

describe('message size limits', () => {
  test('a message over 4 MiB: RESOURCE_EXHAUSTED, nothing written', async () => {
    const { agent, machineId } = await agentWithMachine();
    const answer = await grpcJs(agent).heartbeat({
      machineId,
      hardwareReport: { warning: ['x'.repeat(4 * 1024 * 1024)] },
    });
    expect(answer.status.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('a length prefix promising more than 4 MiB is refused at once: the rest of the body is never read', async () => {
    const { agent, machineId } = await agentWithMachine();
    const { stream, answer } = raw(agent).open();
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(2 ** 31, 1);
    stream.write(prefix);
    // The client goes on writing and never ends its body; the answer comes regardless.
    const chunk = Buffer.alloc(16 * 1024);
    const writing = setInterval(() => {
      if (!stream.destroyed) stream.write(chunk);
    }, 5);
    try {
      const wire = await answer;
      expect(wire.grpcStatus).toBe(Code.ResourceExhausted);
      expect(wire.grpcMessage).toMatch(/2147483648/);
      await eventually('the server closing the stream', async () => (stream.closed ? true : undefined));
    } finally {
      clearInterval(writing);
    }
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('a gzip message that inflates past 4 MiB: RESOURCE_EXHAUSTED', async () => {
    const { agent, machineId } = await agentWithMachine();
    const message = toBinary(
      HeartbeatRequestSchema,
      create(HeartbeatRequestSchema, { machineId, hardwareReport: { warning: ['0'.repeat(8 * 1024 * 1024)] } }),
    );
    const bomb = gzipSync(message);
    expect(bomb.length).toBeLessThan(64 * 1024);
    const wire = await raw(agent).call(grpcFrame(bomb, true), { 'grpc-encoding': 'gzip' });
    expect(wire.grpcStatus).toBe(Code.ResourceExhausted);
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('a second message in a unary call: UNIMPLEMENTED, without waiting for the body to end', async () => {
    const { agent, machineId } = await agentWithMachine();
    const { stream, answer } = raw(agent).open();
    stream.write(grpcFrame(heartbeatMessage(machineId)));
    stream.write(grpcFrame(heartbeatMessage(machineId)));
    const wire = await answer;
    expect(wire.grpcStatus).toBe(Code.Unimplemented);
    stream.destroy();
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });
});

describe('compression', () => {
  test('grpc-encoding gzip is accepted (grpc-js compressing every message), as is identity', async () => {
    const { agent, machineId } = await agentWithMachine();
    const gzip = await grpcJs(agent, { 'grpc.default_compression_algorithm': 2 }).heartbeat({
      machineId,
      hardwareReport: { warning: ['a long warning '.repeat(100)] },
    });
    expect(gzip.status.code).toBe(status.OK);
    const client = raw(agent);
    const wire = await client.call(grpcFrame(gzipSync(heartbeatMessage(machineId)), true), { 'grpc-encoding': 'gzip' });
    expect(wire.grpcStatus).toBe(status.OK);
    // A message may go uncompressed under any encoding (its flag says so).
    const flagOff = await client.call(grpcFrame(heartbeatMessage(machineId)), { 'grpc-encoding': 'gzip' });
    expect(flagOff.grpcStatus).toBe(status.OK);
    const identity = await client.call(grpcFrame(heartbeatMessage(machineId)), { 'grpc-encoding': 'identity' });
    expect(identity.grpcStatus).toBe(status.OK);
    expect(await heartbeatRecorded(machineId)).toBe(true);
  });

  test('an encoding the server does not take: UNIMPLEMENTED naming the ones it takes in grpc-accept-encoding', async () => {
    const { agent, machineId } = await agentWithMachine();
    const wire = await raw(agent).call(grpcFrame(heartbeatMessage(machineId)), { 'grpc-encoding': 'snappy' });
    expect(wire.grpcStatus).toBe(Code.Unimplemented);
    expect((wire.trailers ?? wire.headers)['grpc-accept-encoding']).toMatch(/\bgzip\b/);
    expect(await heartbeatRecorded(machineId)).toBe(false);

    const deflate = await grpcJs(agent, { 'grpc.default_compression_algorithm': 1 }).heartbeat({ machineId });
    expect(deflate.status).toMatchObject({
      code: status.UNIMPLEMENTED,
      details: 'unknown compression "deflate": supported encodings are gzip',
    });
  });

  test('a compressed flag without grpc-encoding: INTERNAL', async () => {
    const { agent, machineId } = await agentWithMachine();
    const wire = await raw(agent).call(grpcFrame(gzipSync(heartbeatMessage(machineId)), true));
    expect(wire.grpcStatus).toBe(Code.Internal);
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });
});

describe('malformed frames', () => {
  test('a body ending inside the length prefix or inside the message: INVALID_ARGUMENT; no message: UNIMPLEMENTED; bytes that are no HeartbeatRequest: INTERNAL', async () => {
    const { agent, machineId } = await agentWithMachine();
    const client = raw(agent);
    const whole = grpcFrame(heartbeatMessage(machineId));
    expect((await client.call(whole.subarray(0, 3))).grpcStatus).toBe(Code.InvalidArgument);
    expect((await client.call(whole.subarray(0, whole.length - 1))).grpcStatus).toBe(Code.InvalidArgument);
    expect((await client.call(new Uint8Array())).grpcStatus).toBe(Code.Unimplemented);
    // Field 1 with wire type 7, which does not exist.
    expect((await client.call(grpcFrame(Uint8Array.of(0x0f, 0x01)))).grpcStatus).toBe(Code.Internal);
    expect(await heartbeatRecorded(machineId)).toBe(false);
    // The connection is as good as before.
    expect((await client.call(whole)).grpcStatus).toBe(status.OK);
  });
});

describe('a slow client', () => {
  test('holding its stream half-sent holds up no one; its heartbeat is answered once its body is whole (within the request timeout, 30 s)', async () => {
    const slow = await agentWithMachine();
    const { stream, answer } = raw(slow.agent).open();
    const whole = grpcFrame(heartbeatMessage(slow.machineId));
    stream.write(whole.subarray(0, 10));
    const others = await Promise.all(Array.from({ length: 5 }, () => agentWithMachine()));
    const answers = await Promise.all(others.map(({ agent, machineId }) => grpcJs(agent).heartbeat({ machineId })));
    expect(answers.map((a) => a.status.code)).toEqual(others.map(() => status.OK));
    expect(await heartbeatRecorded(slow.machineId)).toBe(false);
    stream.end(whole.subarray(10));
    expect((await answer).grpcStatus).toBe(status.OK);
    expect(await heartbeatRecorded(slow.machineId)).toBe(true);
  });

  test('one that gives up mid-body leaves nothing behind: nothing written, nothing counted', async () => {
    const { agent, machineId } = await agentWithMachine();
    const before = await counted();
    const { stream } = raw(agent).open();
    stream.write(grpcFrame(heartbeatMessage(machineId)).subarray(0, 8));
    stream.close();
    await eventually('the stream closed', async () => (stream.closed ? true : undefined));
    // A heartbeat after it goes through: the server is not stuck on the abandoned one.
    const other = await agentWithMachine();
    expect((await grpcJs(other.agent).heartbeat({ machineId: other.machineId })).status.code).toBe(status.OK);
    expect(await heartbeatRecorded(machineId)).toBe(false);
    const after = await counted();
    expect(after.durations).toBe(before.durations + 1);
    expect(after.codes.ok).toBe((before.codes.ok ?? 0) + 1);
  });
});

describe('what the gRPC library still serves', () => {
  test('a content-type that is not gRPC: HTTP 415, nothing written', async () => {
    const { agent, machineId } = await agentWithMachine();
    const wire = await raw(agent).call(grpcFrame(heartbeatMessage(machineId)), { 'content-type': 'text/plain' });
    expect(wire.headers[':status']).toBe(415);
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('gRPC with JSON messages (application/grpc+json)', async () => {
    const { agent, machineId } = await agentWithMachine();
    const json = new TextEncoder().encode(JSON.stringify({ machineId }));
    const wire = await raw(agent).call(grpcFrame(json), { 'content-type': 'application/grpc+json' });
    expect(wire.grpcStatus).toBe(status.OK);
    expect(await heartbeatRecorded(machineId)).toBe(true);
  });

  test('an unknown method or service: UNIMPLEMENTED', async () => {
    const { agent, machineId } = await agentWithMachine();
    const client = grpcJs(agent);
    for (const unknown of [
      '/cloud.bmaas.server.api.AgentCallback/Reboot',
      '/cloud.bmaas.server.api.Nothing/Heartbeat',
    ]) {
      const answer = await client.heartbeat({ machineId }, { path: unknown });
      expect(answer.status.code).toBe(status.UNIMPLEMENTED);
    }
    expect(await heartbeatRecorded(machineId)).toBe(false);
  });

  test('Connect and gRPC-Web (HTTP/2 and HTTP/1.1): heartbeats recorded, refusals with their code', async () => {
    const transports = {
      connect: createConnectTransport,
      grpcWeb: createGrpcWebTransport,
    };
    for (const [name, transport] of Object.entries(transports)) {
      for (const httpVersion of ['2', '1.1'] as const) {
        const { agent, machineId } = await agentWithMachine();
        const client = createClient(
          AgentCallback,
          transport({
            baseUrl: `https://localhost:${t.server.port}`,
            httpVersion,
            nodeOptions: { ca: t.ca, cert: agent.cert, key: agent.key },
          }),
        );
        await client.heartbeat({ machineId });
        expect(await heartbeatRecorded(machineId), `${name} over HTTP/${httpVersion}`).toBe(true);
        const refused = await client.heartbeat({ machineId: 'nope' }).catch((e: unknown) => e);
        expect((refused as ConnectError).code, `${name} over HTTP/${httpVersion}`).toBe(Code.InvalidArgument);
      }
    }
  });
});

describe('batching and metrics', () => {
  test('many agents at once, each on its own connection: all recorded, the 29 behind a statement in flight in one', async () => {
    const fleet = await Promise.all(Array.from({ length: 30 }, () => agentWithMachine()));
    const before = await heartbeatStatements(registry);
    // The first heartbeat's statement held until the 29 others are queued behind it, so they share one whatever
    // the machine's speed: two statements for 30 heartbeats.
    const answers = await heartbeatsBehindAHeldOne(t, fleet);
    expect(answers.map((a) => a.grpcStatus)).toEqual(fleet.map(() => status.OK));
    expect(await heartbeatStatements(registry)).toBe(before + 2);
    for (const { machineId } of fleet) expect(await heartbeatRecorded(machineId)).toBe(true);
  });

  test('bmaas_server_requests_total by code and the duration histogram count the calls the handler answered', async () => {
    const { agent, machineId } = await agentWithMachine();
    const before = await counted();
    const client = grpcJs(agent);
    await client.heartbeat({ machineId });
    await client.heartbeat({ machineId });
    await grpcJs(agentIdentity()).heartbeat({ machineId });
    await client.heartbeat({ machineId: 'bad' });
    // A broken frame never reaches the handler: not counted.
    await raw(agent).call(Uint8Array.of(0, 0));
    const after = await counted();
    expect(after.codes.ok).toBe((before.codes.ok ?? 0) + 2);
    expect(after.codes.unauthenticated).toBe((before.codes.unauthenticated ?? 0) + 1);
    expect(after.codes.invalid_argument).toBe((before.codes.invalid_argument ?? 0) + 1);
    expect(after.durations).toBe(before.durations + 4);
  });
});

/** Another server on the file's BMDB, with `limits` and its own metrics. */
async function limitedServer(
  limits: BmaasServerOptions['limits'],
): Promise<{ server: BmaasServer; registry: Registry; client: (identity?: AgentIdentity) => RawGrpcClient }> {
  const own = new Registry();
  const server = await BmaasServer.start({
    bmdb: t.bmdb,
    listen: { host: '127.0.0.1', port: 0 },
    tls: { cert: t.ca, key: await serverKey() },
    metrics: own,
    ...(limits && { limits }),
  });
  closing.push({ close: () => void server.close(0) });
  const client = (identity?: AgentIdentity) => {
    const raw = new RawGrpcClient(server.port, t.ca, identity);
    closing.push(raw);
    return raw;
  };
  return { server, registry: own, client };
}

/** `bmaas_server_buffered_request_bytes` of `registry`. */
async function buffered(registry: Registry): Promise<number | undefined> {
  return (await registry.getSingleMetric('bmaas_server_buffered_request_bytes')?.get())?.values[0]?.value;
}

/** A gRPC frame's length prefix promising `length` bytes, and `sent` bytes of them. */
function unfinished(length: number, sent: number): Buffer {
  const frame = Buffer.alloc(5 + sent, 0x61);
  frame[0] = 0;
  frame.writeUInt32BE(length, 1);
  return frame;
}

const NO_CERTIFICATE = 'machine id or public key unknown: no client certificate over an ed25519 key';

describe('limits: what a client may hold of the server', () => {
  test('a connection without a client certificate is refused before its body is read, on the lean path and the library’s', async () => {
    const { server, registry: own, client } = await limitedServer(undefined);
    const anonymous = client();
    const { stream, answer } = anonymous.open();
    // A body that announces 4 MiB and never ends: the answer comes regardless.
    stream.write(unfinished(4 * 1024 * 1024, 16 * 1024));
    const wire = await answer;
    expect(wire.grpcStatus).toBe(Code.Unauthenticated);
    expect(wire.grpcMessage).toBe(NO_CERTIFICATE);
    const connect = anonymous.open({ 'content-type': 'application/proto', 'connect-protocol-version': '1' });
    connect.stream.write(Buffer.alloc(16 * 1024));
    const refused = await connect.answer;
    expect(refused.headers[':status']).toBe(401);
    expect(JSON.parse(refused.body.toString())).toEqual({ code: 'unauthenticated', message: NO_CERTIFICATE });
    expect(await buffered(own)).toBe(0);
    // Connect and gRPC-Web clients, over HTTP/1.1 and HTTP/2, read the refusal as theirs.
    for (const transport of [createConnectTransport, createGrpcWebTransport]) {
      for (const httpVersion of ['2', '1.1'] as const) {
        const error = await createClient(
          AgentCallback,
          transport({ baseUrl: `https://localhost:${server.port}`, httpVersion, nodeOptions: { ca: t.ca } }),
        )
          .heartbeat({ machineId: '6f1c1c3e-0000-4000-8000-000000000004' })
          .catch((e: unknown) => e);
        expect((error as ConnectError).code, `${transport.name} over HTTP/${httpVersion}`).toBe(Code.Unauthenticated);
      }
    }
    // Each was counted as the handler's refusals are.
    expect(await own.getSingleMetricAsString('bmaas_server_requests_total')).toMatch(
      /bmaas_server_requests_total\{method="Heartbeat",code="unauthenticated"\} 6/,
    );
  });

  test('bytes buffered per connection and in all are bounded: the request that would pass either is cut off, naming the limit; the others go on', async () => {
    const perConnection = 64 * 1024;
    const overall = 160 * 1024;
    const chunk = 40 * 1024;
    const { registry: own, client } = await limitedServer({
      bufferedBytesPerConnection: perConnection,
      bufferedBytes: overall,
    });
    const { agent, machineId } = await agentWithMachine();
    const first = client(agent);
    const held = first.open();
    held.stream.write(unfinished(1024 * 1024, chunk));
    await eventually('the first body held', async () => ((await buffered(own)) === chunk + 5 ? true : undefined));
    // A second request on the same connection would pass its share.
    const second = first.open();
    second.stream.write(unfinished(1024 * 1024, chunk));
    const cut = await second.answer;
    expect(cut.grpcStatus).toBe(Code.ResourceExhausted);
    expect(cut.grpcMessage).toBe(
      `request cut off: this connection's requests not yet answered passed ${perConnection} bytes`,
    );
    // The library's requests are held to the same shares: one passing the connection's is reset.
    const library = first.open({ 'content-type': 'application/proto', 'connect-protocol-version': '1' });
    library.stream.write(Buffer.alloc(perConnection - chunk));
    await expect(library.answer).rejects.toThrow();
    expect(library.stream.rstCode).toBe(constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(await own.getSingleMetricAsString('bmaas_server_requests_cut_off_total')).toMatch(
      /limit="bufferedBytesPerConnection"\} 2/,
    );
    await eventually('the library’s request let go', async () =>
      (await buffered(own)) === chunk + 5 ? true : undefined,
    );
    // Two more connections hold as much each; a fourth would pass the server's whole.
    for (let i = 0; i < 2; i++)
      client(agent)
        .open()
        .stream.write(unfinished(1024 * 1024, chunk));
    await eventually('three bodies held', async () => ((await buffered(own)) === 3 * (chunk + 5) ? true : undefined));
    const fourth = client(agent).open();
    fourth.stream.write(unfinished(1024 * 1024, chunk));
    const over = await fourth.answer;
    expect(over.grpcStatus).toBe(Code.ResourceExhausted);
    expect(over.grpcMessage).toBe(`request cut off: the server holds ${overall} bytes of requests not yet answered`);
    expect(await buffered(own)).toBe(3 * (chunk + 5));
    // An agent's heartbeat fits beside them.
    expect((await client(agent).call(grpcFrame(heartbeatMessage(machineId)))).grpcStatus).toBe(status.OK);
    expect(await heartbeatRecorded(machineId)).toBe(true);
    // What a connection held goes with it.
    held.stream.close();
    await eventually('the first body let go', async () =>
      (await buffered(own)) === 2 * (chunk + 5) ? true : undefined,
    );
  });

  test('a connection has at most streamsPerConnection streams open, as HTTP/2 tells its client', async () => {
    const { registry: own, client } = await limitedServer({ streamsPerConnection: 4 });
    const { agent } = await agentWithMachine();
    const raw = client(agent);
    await eventually('the server’s settings', async () =>
      raw.session.remoteSettings.maxConcurrentStreams === 4 ? true : undefined,
    );
    const calls = Array.from({ length: 6 }, () => raw.open());
    for (const call of calls) call.stream.write(unfinished(1024 * 1024, 1024));
    await eventually('four bodies held', async () => ((await buffered(own)) === 4 * 1029 ? true : undefined));
    // As streams end, those waiting open.
    calls[0]?.stream.close();
    calls[1]?.stream.close();
    await eventually('the waiting two held', async () => ((await buffered(own)) === 4 * 1029 ? true : undefined));
    expect(calls.slice(2).every((call) => call.stream.id !== undefined)).toBe(true);
  });

  test('limits that cannot hold are refused, naming the option', async () => {
    const start = (limits: BmaasServerOptions['limits']) =>
      BmaasServer.start({
        bmdb: t.bmdb,
        listen: { host: '127.0.0.1', port: 0 },
        tls: { cert: t.ca, key: 'unused' },
        ...(limits && { limits }),
      });
    await expect(start({ bufferedBytes: 1024, bufferedBytesPerConnection: 2048 })).rejects.toThrow(
      new BmaasServerError('server limits: bufferedBytesPerConnection (2048) is more than bufferedBytes (1024)'),
    );
    await expect(start({ requestTimeout: 0 })).rejects.toThrow(
      'server limits: requestTimeout must be a whole number above zero, got 0',
    );
    await expect(start({ streamsPerConnection: 1.5 })).rejects.toThrow(BmaasServerError);
    await expect(start({ connections: 0 })).rejects.toThrow(
      'server limits: connections must be a whole number above zero, got 0',
    );
  });

  test('a request not whole within requestTimeout is cut off, naming it; a connection without a new request for idleTimeout is closed', async () => {
    const { registry: own, client } = await limitedServer({ requestTimeout: 500, idleTimeout: 1000 });
    const { agent, machineId } = await agentWithMachine();
    const raw = client(agent);
    const { stream, answer } = raw.open();
    stream.write(grpcFrame(heartbeatMessage(machineId)).subarray(0, 10));
    const wire = await answer;
    expect(wire.grpcStatus).toBe(Code.DeadlineExceeded);
    expect(wire.grpcMessage).toBe('request cut off: not whole within 500 ms');
    expect(await heartbeatRecorded(machineId)).toBe(false);
    // The library's: reset.
    const library = raw.open({ 'content-type': 'application/proto', 'connect-protocol-version': '1' });
    library.stream.write(Buffer.alloc(10));
    await expect(library.answer).rejects.toThrow();
    expect(library.stream.rstCode).toBe(constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(await own.getSingleMetricAsString('bmaas_server_requests_cut_off_total')).toMatch(
      /limit="requestTimeout"\} 2/,
    );
    expect(await buffered(own)).toBe(0);
    // Left idle, the connection is asked to go.
    await eventually('the connection closed', async () => (raw.session.closed ? true : undefined));
  });

  test('an idle HTTP/1.1 connection is closed after idleTimeout, as an HTTP/2 one is', async () => {
    // Long enough for the handshake, the request and its answer under a loaded machine's database.
    const { server } = await limitedServer({ idleTimeout: 1500 });
    const { agent, machineId } = await agentWithMachine();
    const socket = tlsConnect({
      host: '127.0.0.1',
      port: server.port,
      servername: 'localhost',
      ca: t.ca,
      cert: agent.cert,
      key: agent.key,
      ALPNProtocols: ['http/1.1'],
    });
    closing.push({ close: () => socket.destroy() });
    let received = '';
    let closed = false;
    socket.on('data', (chunk: Buffer) => {
      received += chunk.toString();
    });
    socket.on('close', () => {
      closed = true;
    });
    await new Promise((resolve, reject) => socket.once('secureConnect', resolve).once('error', reject));
    socket.on('error', () => {});
    expect(socket.alpnProtocol).toBe('http/1.1');
    // A Connect call with JSON, kept alive as HTTP/1.1 keeps connections.
    const body = JSON.stringify({ machineId });
    socket.write(
      `POST /cloud.bmaas.server.api.AgentCallback/Heartbeat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    await eventually('the answer', async () => (received.includes('\r\n\r\n') ? true : undefined));
    expect(received).toMatch(/^HTTP\/1\.1 200 /);
    expect(received).not.toMatch(/connection: close/i);
    expect(await heartbeatRecorded(machineId)).toBe(true);
    await eventually('the idle connection closed by the server', async () => (closed ? true : undefined), 10_000);
  });

  test('at most `connections` are open: those past it are closed as they are accepted, counted, logged once; once one closes, a new one is served', async () => {
    const { registry: own, client } = await limitedServer({ connections: 2 });
    const { agent, machineId } = await agentWithMachine();
    const first = client(agent);
    const second = client(agent);
    for (const open of [first, second]) {
      expect((await open.call(grpcFrame(heartbeatMessage(machineId)))).grpcStatus).toBe(status.OK);
    }
    const { lines, restore } = captureDebugLog('bmaas:server');
    try {
      for (let i = 0; i < 2; i++) {
        const refused = client(agent);
        let connected = false;
        refused.session.once('connect', () => {
          connected = true;
        });
        await eventually('the connection past the limit closed', async () =>
          refused.session.destroyed ? true : undefined,
        );
        expect(connected).toBe(false);
      }
    } finally {
      restore();
    }
    expect(lines.filter((line) => line.includes('connections limit'))).toEqual([
      expect.stringContaining('at 2 open connections (its connections limit): refusing new ones until some close'),
    ]);
    expect(await own.getSingleMetricAsString('bmaas_server_connections_refused_total')).toMatch(
      /bmaas_server_connections_refused_total 2/,
    );
    first.close();
    await eventually('a new connection served', async () => {
      const wire = await client(agent)
        .call(grpcFrame(heartbeatMessage(machineId)))
        .catch(() => undefined);
      return wire?.grpcStatus === status.OK ? true : undefined;
    });
  });

  /** A HeartbeatRequest carrying a hardware report warning of `bytes` bytes. */
  function reportMessage(machineId: string, bytes: number): Uint8Array {
    return toBinary(
      HeartbeatRequestSchema,
      create(HeartbeatRequestSchema, { machineId, hardwareReport: { warning: ['x'.repeat(bytes)] } }),
    );
  }

  /** Holds `machineId`'s AgentStarted row until `release`: its heartbeats wait on the database. */
  async function holdMachine(machineId: string): Promise<{ release(): Promise<void> }> {
    const blocker = new pg.Client({ connectionString: t.db.url });
    await blocker.connect();
    await blocker.query('BEGIN');
    await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [machineId]);
    return {
      async release() {
        await blocker.query('ROLLBACK');
        await blocker.end();
      },
    };
  }

  test('heartbeats waiting on the database are held against the connection’s share until answered: the one that would pass it is cut off', async () => {
    const perConnection = 64 * 1024;
    const { registry: own, client } = await limitedServer({ bufferedBytesPerConnection: perConnection });
    const { agent, machineId } = await agentWithMachine();
    const frame = grpcFrame(reportMessage(machineId, 20 * 1024));
    const held = await holdMachine(machineId);
    const raw = client(agent);
    let waiting: Promise<RawAnswer>[] = [];
    try {
      waiting = [1, 2, 3].map(() => raw.call(frame));
      await eventually('three whole heartbeats held while they wait', async () =>
        (await buffered(own)) === 3 * frame.length ? true : undefined,
      );
      const cut = await raw.call(frame);
      expect(cut.grpcStatus).toBe(Code.ResourceExhausted);
      expect(cut.grpcMessage).toBe(
        `request cut off: this connection's requests not yet answered passed ${perConnection} bytes`,
      );
    } finally {
      await held.release();
    }
    expect((await Promise.all(waiting)).map((wire) => wire.grpcStatus)).toEqual([status.OK, status.OK, status.OK]);
    await eventually('the answered heartbeats let go', async () => ((await buffered(own)) === 0 ? true : undefined));
  });

  test('a request not answered within requestTimeout is cut off, naming it; its bytes are held until the database answered', async () => {
    const { registry: own, client } = await limitedServer({ requestTimeout: 500 });
    const { agent, machineId } = await agentWithMachine();
    const frame = grpcFrame(heartbeatMessage(machineId));
    const held = await holdMachine(machineId);
    const raw = client(agent);
    try {
      const wire = await raw.call(frame);
      expect(wire.grpcStatus).toBe(Code.DeadlineExceeded);
      expect(wire.grpcMessage).toBe('request cut off: not answered within 500 ms');
      // The library's: reset.
      const library = raw.open({ 'content-type': 'application/proto', 'connect-protocol-version': '1' });
      library.stream.end(heartbeatMessage(machineId));
      await expect(library.answer).rejects.toThrow();
      expect(library.stream.rstCode).toBe(constants.NGHTTP2_ENHANCE_YOUR_CALM);
      // The handler still holds the lean path's request, waiting on the database.
      expect(await buffered(own)).toBe(frame.length);
    } finally {
      await held.release();
    }
    await eventually('the request let go once the database answered', async () =>
      (await buffered(own)) === 0 ? true : undefined,
    );
    expect(await own.getSingleMetricAsString('bmaas_server_requests_cut_off_total')).toMatch(
      /limit="requestTimeout"\} 2/,
    );
  });

  test('a call waiting on the database is answered by its deadline or its requestTimeout, whichever comes first', async () => {
    const { registry: own, client } = await limitedServer({ requestTimeout: 1000 });
    const { agent, machineId } = await agentWithMachine();
    const frame = grpcFrame(heartbeatMessage(machineId));
    const held = await holdMachine(machineId);
    const raw = client(agent);
    try {
      // The deadline first: answered as timed out, and no limit counted as passed.
      const early = await raw.call(frame, { 'grpc-timeout': '300m' });
      expect(early.grpcStatus).toBe(Code.DeadlineExceeded);
      expect(early.grpcMessage).toBe('the operation timed out');
      // The requestTimeout first: cut off, naming it.
      const late = await raw.call(frame, { 'grpc-timeout': '20S' });
      expect(late.grpcStatus).toBe(Code.DeadlineExceeded);
      expect(late.grpcMessage).toBe('request cut off: not answered within 1000 ms');
      // Both requests still held: the handler waits on the database for each.
      expect(await buffered(own)).toBe(2 * frame.length);
    } finally {
      await held.release();
    }
    await eventually('both requests let go once the database answered', async () =>
      (await buffered(own)) === 0 ? true : undefined,
    );
    expect(await own.getSingleMetricAsString('bmaas_server_requests_cut_off_total')).toMatch(
      /limit="requestTimeout"\} 1/,
    );
  });

  test('a connection idle for idleTimeout while its request waits on the database is asked to go, and the request still answered', async () => {
    const { client } = await limitedServer({ idleTimeout: 500 });
    const { agent, machineId } = await agentWithMachine();
    const held = await holdMachine(machineId);
    const raw = client(agent);
    let goaway = false;
    raw.session.on('goaway', () => {
      goaway = true;
    });
    const answer = raw.call(grpcFrame(heartbeatMessage(machineId)));
    try {
      await eventually('the connection asked to go', async () => (goaway ? true : undefined));
    } finally {
      await held.release();
    }
    expect((await answer).grpcStatus).toBe(status.OK);
    expect(await heartbeatRecorded(machineId)).toBe(true);
  });

  test('a gzipped message is held as it inflates: one inflating past the connection’s share is cut off', async () => {
    const perConnection = 64 * 1024;
    const { registry: own, client } = await limitedServer({ bufferedBytesPerConnection: perConnection });
    const { agent, machineId } = await agentWithMachine();
    const compressed = gzipSync(reportMessage(machineId, 200 * 1024));
    expect(compressed.length).toBeLessThan(4 * 1024);
    const raw = client(agent);
    const cut = await raw.call(grpcFrame(compressed, true), { 'grpc-encoding': 'gzip' });
    expect(cut.grpcStatus).toBe(Code.ResourceExhausted);
    expect(cut.grpcMessage).toBe(
      `request cut off: this connection's requests not yet answered passed ${perConnection} bytes`,
    );
    expect(await heartbeatRecorded(machineId)).toBe(false);
    // One that inflates to less goes through.
    const small = await raw.call(grpcFrame(gzipSync(reportMessage(machineId, 20 * 1024)), true), {
      'grpc-encoding': 'gzip',
    });
    expect(small.grpcStatus).toBe(status.OK);
    await eventually('nothing held', async () => ((await buffered(own)) === 0 ? true : undefined));
  });
});
