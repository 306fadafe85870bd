import type { KeyObject } from 'node:crypto';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { Http2SessionManager } from '@connectrpc/connect-node';

/** Where the agent calls the server, and as whom. */
export interface ServerConnectionOptions {
  readonly machineId: string;
  /** host:port of the BMaaS server (TakeoverInit.bmaas_endpoint). */
  readonly endpoint: string;
  /** The agent's ed25519 key: its client certificate's, by which the server knows it. */
  readonly privateKey: KeyObject;
  /** PEM CA certificate of the server; absent: the system's CAs. */
  readonly ca?: string | undefined;
}

/**
 * The agent's HTTP/2 connection to the server, over TLS with its client
 * certificate, kept between calls: what the heartbeat and enrollment clients
 * both send their calls through.
 */
export function serverConnection(options: ServerConnectionOptions): {
  readonly baseUrl: string;
  readonly session: Http2SessionManager;
} {
  const baseUrl = `https://${options.endpoint}`;
  const session = new Http2SessionManager(baseUrl, undefined, {
    cert: clientCertificate(options.privateKey, options.machineId),
    key: options.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    ...(options.ca !== undefined && { ca: options.ca }),
  });
  return { baseUrl, session };
}

/**
 * The agent's TLS client certificate: self-signed over its ed25519 key. The
 * server authenticates the agent by the key alone (the one its
 * TakeoverSuccess returned), so the certificate carries nothing else: a
 * common name, a validity, the key, the signature.
 */
export function clientCertificate(privateKey: KeyObject, machineId: string): string {
  if (privateKey.asymmetricKeyType !== 'ed25519') {
    throw new TypeError(`agent of machine ${machineId}: its key is ${privateKey.asymmetricKeyType}, not ed25519`);
  }
  // An hour back, as clocks disagree; a year on, as an agent lives for hours.
  const now = Date.now();
  const der = selfSignedCertificate(privateKey, {
    commonName: `agent ${machineId}`,
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + 365 * 86_400_000),
  });
  return certificatePem(der);
}
