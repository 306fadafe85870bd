import type { IncomingHttpHeaders, ServerHttp2Stream } from 'node:http2';
import { performance } from 'node:perf_hooks';
import { AgentHardwareReportSchema } from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import {
  type EnrollRequest,
  EnrollRequestSchema,
  type EnrollResponse,
  EnrollResponseSchema,
} from '@bmaas/api/cloud/bmaas/server/api/enrollment_pb';
import { type BMDB, BMDBError, ConnectionClosedError, DatabaseUnreachableError } from '@bmaas/bmdb-controlloop';
import { type EnrollmentOutcome, EnrollmentRefusedError, enrollAgent } from '@bmaas/bmdb-model';
import { isUuid } from '@bmaas/common';
import { create, toBinary } from '@bufbuild/protobuf';
import { Code, ConnectError } from '@connectrpc/connect';
import { UnaryCall } from './grpc-unary.js';
import type { RequestBudget } from './limits.js';
import { log } from './log.js';
import type { ServerMetrics } from './metrics.js';
import { connectionPeerKey } from './peer-key.js';

const ENROLLED: EnrollResponse = create(EnrollResponseSchema);

/** What a call without a key is answered as: any request is refused alike. */
const EMPTY_REQUEST: EnrollRequest = create(EnrollRequestSchema);

/**
 * Enroll over the BMDB (`enrollAgent`), on every route it is served on (the
 * lean path's calls, {@link Enrollments.serve}, and the gRPC library's,
 * {@link Enrollments.answer}): the connection's client-certificate
 * key becomes the machine's AgentStarted key, as a takeover's would, so the
 * agent's heartbeats are accepted from then on. A refused token is answered
 * PERMISSION_DENIED with the library's message (the machine and why, never
 * the token): the agent proved its key, but not that it may be this
 * machine's. The token used already, presented again with the key it
 * enrolled (the answer to the first was lost), is answered OK again, and
 * counted as `Repeated`; UNAUTHENTICATED stays what it is for heartbeats, a connection
 * without a key. An installed machine (its OS runs, no newer request) is
 * FAILED_PRECONDITION; a BMDB that cannot be reached, UNAVAILABLE (the
 * agent tries again). Each enrollment is counted by its result
 * (`bmaas_server_enrollments_total`), and as a request by its status.
 */
export class Enrollments {
  readonly #bmdb: BMDB;
  readonly #metrics: ServerMetrics | undefined;

  constructor(bmdb: BMDB, metrics: ServerMetrics | undefined) {
    this.#bmdb = bmdb;
    this.#metrics = metrics;
  }

  /** Serves one Enroll call of the lean path, as `Heartbeats.serve` serves a heartbeat. */
  serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, budget: RequestBudget): void {
    const call = UnaryCall.open(stream, headers);
    if (call === undefined) return;
    const key = connectionPeerKey(stream.session);
    // As a heartbeat's: a connection without a key is refused (and counted) before its body is read.
    if (key === undefined) {
      call.answer(this.answer(EMPTY_REQUEST, undefined), EnrollResponseSchema);
      return;
    }
    call.read(budget, EnrollRequestSchema).then((request) => {
      if (request !== undefined) call.answer(this.answer(request, key), EnrollResponseSchema);
    });
  }

  /**
   * Answers one Enroll from the agent whose connection proved it holds
   * `key` (as `Heartbeats.answer` does); refusals reject with a
   * `ConnectError` whose code is the gRPC status to answer with.
   */
  async answer(request: EnrollRequest, key: Uint8Array | undefined): Promise<EnrollResponse> {
    const metrics = this.#metrics;
    const started = performance.now();
    try {
      const outcome = await enroll(this.#bmdb, request, key);
      metrics?.enrollments.inc({ result: outcome === 'repeated' ? 'Repeated' : 'Enrolled' });
      metrics?.requests.inc({ method: 'Enroll', code: 'ok' });
      return ENROLLED;
    } catch (error) {
      if (error instanceof ConnectError && error.cause instanceof EnrollmentRefusedError) {
        metrics?.enrollments.inc({ result: error.cause.reason });
      }
      const code = error instanceof ConnectError ? Code[error.code] : 'Unknown';
      metrics?.requests.inc({ method: 'Enroll', code: code.replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase() });
      throw error;
    } finally {
      metrics?.duration.observe({ method: 'Enroll' }, (performance.now() - started) / 1000);
    }
  }
}

async function enroll(bmdb: BMDB, request: EnrollRequest, key: Uint8Array | undefined): Promise<EnrollmentOutcome> {
  const { machineId } = request;
  if (key === undefined) {
    log.enrollment('refused an enrollment of machine %o: no client certificate over an ed25519 key', machineId);
    throw new ConnectError(
      `enrollment of machine ${machineId} refused: no client certificate over an ed25519 key`,
      Code.Unauthenticated,
    );
  }
  if (!isUuid(machineId)) {
    throw new ConnectError(`machine_id ${JSON.stringify(machineId)} is not a UUID`, Code.InvalidArgument);
  }
  let outcome: EnrollmentOutcome;
  try {
    outcome = await enrollAgent(bmdb.db, {
      machineId,
      token: request.token,
      agentPublicKey: key,
      ...(request.hardwareReport && { hardwareReport: toBinary(AgentHardwareReportSchema, request.hardwareReport) }),
    });
  } catch (error) {
    if (error instanceof EnrollmentRefusedError) {
      log.enrollment('%s', error.message);
      throw new ConnectError(error.message, Code.PermissionDenied, undefined, undefined, error);
    }
    // What the BMDB refused of the machine itself (it is installed), not a database out of reach.
    if (
      error instanceof BMDBError &&
      !(error instanceof DatabaseUnreachableError || error instanceof ConnectionClosedError)
    ) {
      log.enrollment('refused an enrollment of machine %s: %s', machineId, error.message);
      throw new ConnectError(error.message, Code.FailedPrecondition);
    }
    log.server('could not record the enrollment of machine %s: %s', machineId, (error as Error).message);
    throw new ConnectError(`could not record the enrollment of machine ${machineId}`, Code.Unavailable);
  }
  const hex = Buffer.from(key).toString('hex');
  if (outcome === 'repeated') {
    log.enrollment('enrolled the agent of machine %s with key %s already: answered again as then', machineId, hex);
  } else {
    log.enrollment('enrolled the agent of machine %s with key %s', machineId, hex);
  }
  return outcome;
}
