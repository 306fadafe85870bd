import { generateKeyPairSync, type KeyObject } from 'node:crypto';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import { AgentCallback, agentApi, certificatePem, selfSignedCertificate } from '../src/index.js';

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
