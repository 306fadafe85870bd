import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { newMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import type { Registry } from 'prom-client';
import { afterAll } from 'vitest';
import { type TestDatabase, testBMDB } from '../../../test/support/database.js';
import { AgentCallback, agentApi, BmaasServer, selfSignedServerTls } from '../src/index.js';

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
