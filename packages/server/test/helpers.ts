import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { AgentHeartbeats, newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { create, toBinary } from '@bufbuild/protobuf';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import pg from 'pg';
import type { Registry } from 'prom-client';
import { afterAll } from 'vitest';
import { type TestDatabase, testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import { AgentCallback, agentApi, BmaasServer, HeartbeatRequestSchema, selfSignedServerTls } from '../src/index.js';
import { grpcFrame, type RawAnswer, RawGrpcClient } from './standard-clients.js';

/** A server of the calling test file's own: its database, BMDB, certificate directory and CA. */
export interface TestServer {
  readonly db: TestDatabase;
  readonly bmdb: BMDB;
  readonly server: BmaasServer;
  /** Where its self-signed certificate was made. */
  readonly dir: string;
  /** Its certificate, which clients trust. */
  readonly ca: string;
}

/**
 * Starts a BmaasServer on a fresh test database with a self-signed
 * certificate, its metrics (and the BMDB's) on `registry`; all of it closed
 * and removed after the file's tests. Call in `beforeAll`.
 */
export async function startTestServer(registry: Registry): Promise<TestServer> {
  const { db, bmdb } = await testBMDB({ metrics: registry });
  const dir = await mkdtemp(path.join(tmpdir(), 'bmaas-server-test-'));
  const tls = await selfSignedServerTls(dir);
  const server = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls, metrics: registry });
  afterAll(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });
  return { db, bmdb, server, dir, ca: tls.cert };
}

/** Heartbeat statements the BMDB ran so far (the count of `bmdb_agent_heartbeat_batch_size` on `registry`). */
export async function heartbeatStatements(registry: Registry): Promise<number> {
  const text = await registry.getSingleMetricAsString('bmdb_agent_heartbeat_batch_size');
  return Number(/bmdb_agent_heartbeat_batch_size_count (\d+)/.exec(text)?.[1]);
}

/** A new machine whose agent started with `agent`'s key. */
export async function startedMachine(bmdb: BMDB, agent: AgentIdentity): Promise<string> {
  const q = bmdb.db;
  const machineId = await newMachine(q);
  await setAgentStarted(q, machineId, { publicKey: agent.publicKey });
  return machineId;
}

/** An agent's key pair, its raw public key, and a self-signed client certificate over it. */
export interface AgentIdentity {
  readonly privateKey: KeyObject;
  readonly publicKey: Uint8Array;
  readonly cert: string;
  readonly key: string;
}

export function agentIdentity(type: 'ed25519' | 'ec' = 'ed25519'): AgentIdentity {
  const { privateKey, publicKey } =
    type === 'ec' ? generateKeyPairSync('ec', { namedCurve: 'P-256' }) : generateKeyPairSync('ed25519');
  const raw =
    type === 'ed25519' ? Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url') : Buffer.alloc(32);
  return {
    privateKey,
    publicKey: new Uint8Array(raw),
    cert: certificatePem(selfSignedCertificate(privateKey, { commonName: 'agent' })),
    key: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  };
}

/** A gRPC client of AgentCallback at `port`, trusting `ca`, presenting `identity` (if any). */
export function agentClient(port: number, ca: string, identity?: AgentIdentity): Client<typeof AgentCallback> {
  return createClient(
    AgentCallback,
    createGrpcTransport({
      baseUrl: `https://localhost:${port}`,
      nodeOptions: { ca, ...(identity && { cert: identity.cert, key: identity.key }) },
    }),
  );
}

/** {@link agentClient} under the current upstream agent's service name, `cloud.agent.api.AgentCallback`. */
export function currentAgentClient(
  port: number,
  ca: string,
  identity?: AgentIdentity,
): Client<typeof agentApi.AgentCallback> {
  return createClient(
    agentApi.AgentCallback,
    createGrpcTransport({
      baseUrl: `https://localhost:${port}`,
      nodeOptions: { ca, ...(identity && { cert: identity.cert, key: identity.key }) },
    }),
  );
}

/** An agent and its machine (whose AgentStarted tag has the agent's key). */
export interface AgentOfMachine {
  readonly agent: AgentIdentity;
  readonly machineId: string;
}

/**
 * One heartbeat from each agent of `fleet`, each on its own connection,
 * sent so that all but the first share one statement whatever the
 * machine's speed: the first machine's AgentStarted row is held
 * (`FOR UPDATE`, in a transaction of its own) until its heartbeat's
 * statement waits for it, a batch in flight; the others are then sent
 * whole, and the row let go only once the server handed each to the BMDB
 * (`AgentHeartbeats.answer` called, which queues it behind the statement
 * in flight before it returns). Resolves with each heartbeat's answer, in
 * `fleet`'s order.
 */
export async function heartbeatsBehindAHeldOne(t: TestServer, fleet: readonly AgentOfMachine[]): Promise<RawAnswer[]> {
  const [held] = fleet;
  if (held === undefined) return [];
  const clients = fleet.map(({ agent }) => new RawGrpcClient(t.server.port, t.ca, agent));
  const frames = fleet.map(({ machineId }) =>
    grpcFrame(toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { machineId }))),
  );
  // The heartbeats the server handed to the BMDB: the server calls this method of the BMDB's AgentHeartbeats.
  const heartbeats = AgentHeartbeats.of(t.bmdb);
  const answer = heartbeats.answer;
  let handed = 0;
  heartbeats.answer = (heartbeat) => {
    handed += 1;
    return answer.call(heartbeats, heartbeat);
  };
  const blocker = new pg.Client({ connectionString: t.db.url });
  await blocker.connect();
  try {
    const { rows } = await blocker.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    await blocker.query('BEGIN');
    await blocker.query('SELECT 1 FROM machine_agent_started WHERE machine_id = $1 FOR UPDATE', [held.machineId]);
    const first = (clients[0] as RawGrpcClient).call(frames[0] as Buffer);
    await eventually('the first heartbeat’s statement waiting for the held row', async () => {
      const { rowCount } = await t.db.admin('SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))', [
        rows[0]?.pid,
      ]);
      return rowCount ? true : undefined;
    });
    const others = clients.slice(1).map((client, i) => client.call(frames[i + 1] as Buffer));
    await eventually('every heartbeat handed to the BMDB', async () => (handed === fleet.length ? true : undefined));
    await blocker.query('ROLLBACK');
    return await Promise.all([first, ...others]);
  } finally {
    heartbeats.answer = answer;
    await blocker.end();
    for (const client of clients) client.close();
  }
}
