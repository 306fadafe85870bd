import type { KeyObject } from 'node:crypto';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport, Http2SessionManager } from '@connectrpc/connect-node';
import { AgentEnrollment, type EnrollRequest } from '../gen/cloud/bmaas/server/api/enrollment_pb.js';
import { clientCertificate } from './client-certificate.js';

/**
 * AgentEnrollment.Enroll over gRPC, TLS with the agent's self-signed client
 * certificate: the server takes that certificate's key as the machine's
 * agent key, as it authenticates heartbeats by it.
 */
export class EnrollmentClient {
  readonly #client: Client<typeof AgentEnrollment>;
  readonly #session: Http2SessionManager;

  constructor(options: {
    readonly machineId: string;
    /** host:port of the BMaaS server (TakeoverInit.bmaas_endpoint). */
    readonly endpoint: string;
    readonly privateKey: KeyObject;
    /** PEM CA certificate of the server; absent: the system's CAs. */
    readonly ca?: string | undefined;
  }) {
    const baseUrl = `https://${options.endpoint}`;
    this.#session = new Http2SessionManager(baseUrl, undefined, {
      cert: clientCertificate(options.privateKey, options.machineId),
      key: options.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
      ...(options.ca !== undefined && { ca: options.ca }),
    });
    this.#client = createClient(
      AgentEnrollment,
      createGrpcTransport({ baseUrl, sessionManager: this.#session, defaultTimeoutMs: 10_000 }),
    );
  }

  /** One Enroll; rejects with the call's ConnectError when the server refuses it or cannot be reached. */
  async enroll(request: EnrollRequest, signal?: AbortSignal): Promise<void> {
    await this.#client.enroll(request, { signal });
  }

  close(): void {
    this.#session.abort();
  }
}
