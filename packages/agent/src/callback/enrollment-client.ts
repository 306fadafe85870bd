import { AgentEnrollment, type EnrollRequest } from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import { type Client, createClient } from '@connectrpc/connect';
import { createGrpcTransport, type Http2SessionManager } from '@connectrpc/connect-node';
import { type ServerConnectionOptions, serverConnection } from './client-certificate.js';

/**
 * AgentEnrollment.Enroll over gRPC, TLS with the agent's self-signed client
 * certificate: the server takes that certificate's key as the machine's
 * agent key, as it authenticates heartbeats by it.
 */
export class EnrollmentClient {
  readonly #client: Client<typeof AgentEnrollment>;
  readonly #session: Http2SessionManager;

  constructor(options: ServerConnectionOptions) {
    const { baseUrl, session } = serverConnection(options);
    this.#session = session;
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
