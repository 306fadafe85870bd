import type { IncomingHttpHeaders, ServerHttp2Stream } from 'node:http2';
import { performance } from 'node:perf_hooks';
import {
  DiskImageInstallationRequest_Compression as Compression,
  type RootDeviceHints as RootDeviceHintsMessage,
  RootDeviceHintsSchema,
} from '@bmaas/api/cloud/agent/api/disk_image_pb';
import { OSInstallationReportOutcome as ReportOutcome } from '@bmaas/api/cloud/agent/api/installation_report_outcome_pb';
import {
  AgentHardwareReportSchema,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
  type OSInstallationReport as OSInstallationReportMessage,
  OSInstallationReportSchema,
} from '@bmaas/api/cloud/bmaas/server/api/agent_pb';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import {
  AGENT_LOG_MAX_BYTES,
  AgentHeartbeats,
  type OSInstallationReport,
  type PendingOSInstallation,
  type RootDeviceHints,
} from '@bmaas/bmdb-model';
import { isUuid } from '@bmaas/common';
import { create, toBinary } from '@bufbuild/protobuf';
import { Code, ConnectError } from '@connectrpc/connect';
import type { Counter, Histogram } from 'prom-client';
import { UnaryCall } from './grpc-unary.js';
import type { RequestBudget } from './limits.js';
import { log } from './log.js';
import type { ServerMetrics } from './metrics.js';
import { connectionPeerKey } from './peer-key.js';

/**
 * The same answer for every refused agent, as upstream: whether the machine
 * exists is not told to whoever cannot prove to be its agent.
 */
const UNAUTHENTICATED = 'machine id or public key unknown';

/**
 * Heartbeat over the BMDB, on every route it is served on: the lean path's
 * calls ({@link Heartbeats.serve}) and the gRPC library's
 * ({@link Heartbeats.answer}), whatever the protocol and service name, so
 * they cannot differ in what they check, write or count.
 *
 * A heartbeat is accepted only from the agent holding the key of its
 * machine's AgentStarted tag; it sets AgentHeartbeat to the database's now
 * and stores the reports it carries, and the answer carries the machine's
 * pending OS installation request and, when it reported on an
 * installation, whether that report was accepted or ignored (see
 * `AgentHeartbeats.answer`). A `Success` report its agent sends again,
 * having lost the answer, is answered as the first was. Each heartbeat is
 * counted, by the status it settles with, and timed, when it settles.
 */
export class Heartbeats {
  /** The BMDB's agent heartbeats, taken once: every heartbeat of this server goes through them. */
  readonly #heartbeats: AgentHeartbeats;
  readonly #metrics: ServerMetrics | undefined;
  // Label children bound once: no label object built per heartbeat (prom-client still checks and hashes the labels on each call).
  readonly #ok: Counter.Internal | undefined;
  readonly #duration: Histogram.Internal<'method'> | undefined;

  constructor(bmdb: BMDB, metrics: ServerMetrics | undefined) {
    this.#heartbeats = AgentHeartbeats.of(bmdb);
    this.#metrics = metrics;
    this.#ok = metrics?.requests.labels({ method: 'Heartbeat', code: 'ok' });
    this.#duration = metrics?.duration.labels({ method: 'Heartbeat' });
  }

  /**
   * Serves one Heartbeat call of the lean path (gRPC with protobuf, on any
   * service name): a connection without a key is refused before the body
   * is read; otherwise the request is read, held to `budget`, and answered.
   */
  serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, budget: RequestBudget): void {
    const call = UnaryCall.open(stream, headers);
    if (call === undefined) return;
    const key = connectionPeerKey(stream.session);
    // `answer` refuses any call without a key (and counts it) whatever it asks: it is asked with an empty request.
    if (key === undefined) {
      call.answer(this.answer(EMPTY_REQUEST, undefined), HeartbeatResponseSchema);
      return;
    }
    call.read(budget, HeartbeatRequestSchema).then((request) => {
      if (request !== undefined) call.answer(this.answer(request, key), HeartbeatResponseSchema);
    });
  }

  /**
   * Answers one heartbeat from the agent whose connection proved it holds
   * `key` (the ed25519 key of its TLS client certificate; `undefined` when
   * it presented none, or one over another kind of key). Refusals reject
   * with a `ConnectError` whose code is the gRPC status to answer with.
   */
  answer(request: HeartbeatRequest, key: Uint8Array | undefined): Promise<HeartbeatResponse> {
    const started = performance.now();
    // One promise reaction per heartbeat, not an async function around another: this runs thousands of times a second.
    return heartbeat(this.#heartbeats, request, key).then(
      (response) => {
        this.#ok?.inc();
        this.#duration?.observe((performance.now() - started) / 1000);
        return response;
      },
      (error: unknown) => {
        const code = error instanceof ConnectError ? codeName(error.code) : 'unknown';
        this.#metrics?.requests.inc({ method: 'Heartbeat', code });
        this.#duration?.observe((performance.now() - started) / 1000);
        throw error;
      },
    );
  }
}

/** What a call without a key is answered as: any request is refused alike. */
const EMPTY_REQUEST: HeartbeatRequest = create(HeartbeatRequestSchema);

/** The answer without an installation request or report, never changed, so shared: nearly every heartbeat gets it. */
const EMPTY_RESPONSE: HeartbeatResponse = create(HeartbeatResponseSchema);

/**
 * What the agent is told of its report, by what the BMDB made of it: a
 * repeat is accepted, as the report it repeats was, so the agent reboots.
 */
const REPORT_OUTCOMES = {
  stored: ReportOutcome.OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED,
  repeated: ReportOutcome.OS_INSTALLATION_REPORT_OUTCOME_ACCEPTED,
  ignored: ReportOutcome.OS_INSTALLATION_REPORT_OUTCOME_IGNORED,
} as const;

/** The answers to a report without an installation request, shared as EMPTY_RESPONSE is. */
const REPORTED_RESPONSES = {
  stored: create(HeartbeatResponseSchema, { installationReportOutcome: REPORT_OUTCOMES.stored }),
  repeated: create(HeartbeatResponseSchema, { installationReportOutcome: REPORT_OUTCOMES.repeated }),
  ignored: create(HeartbeatResponseSchema, { installationReportOutcome: REPORT_OUTCOMES.ignored }),
} as const;

async function heartbeat(
  heartbeats: AgentHeartbeats,
  request: HeartbeatRequest,
  key: Uint8Array | undefined,
): Promise<HeartbeatResponse> {
  if (key === undefined) {
    log.heartbeat('refused a heartbeat for machine %o: no client certificate over an ed25519 key', request.machineId);
    throw new ConnectError(`${UNAUTHENTICATED}: no client certificate over an ed25519 key`, Code.Unauthenticated);
  }
  if (!isUuid(request.machineId)) {
    throw new ConnectError(`machine_id ${JSON.stringify(request.machineId)} is not a UUID`, Code.InvalidArgument);
  }
  const report = request.installationReport && installationReport(request.machineId, request.installationReport);
  const agentLog = request.agentLog && checkedAgentLog(request.machineId, request.agentLog.text);
  let answer: Awaited<ReturnType<AgentHeartbeats['answer']>>;
  try {
    answer = await heartbeats.answer({
      machineId: request.machineId,
      publicKey: key,
      ...(request.hardwareReport && {
        hardwareReport: toBinary(AgentHardwareReportSchema, request.hardwareReport),
      }),
      ...(report && { installationReport: report }),
      ...(agentLog !== undefined && { agentLog }),
    });
  } catch (error) {
    if (error instanceof ConnectError) throw error;
    log.server('could not record a heartbeat of machine %s: %s', request.machineId, (error as Error).message);
    throw new ConnectError(`could not record the heartbeat of machine ${request.machineId}`, Code.Unavailable);
  }
  if (answer.result === 'unauthenticated') {
    log.heartbeat(
      'refused a heartbeat for machine %s: key %s is not its agent’s',
      request.machineId,
      Buffer.from(key).toString('hex'),
    );
    throw new ConnectError(UNAUTHENTICATED, Code.Unauthenticated);
  }
  if (report) {
    log.heartbeat(
      'machine %s reported its installation of generation %s: %s (%s)',
      request.machineId,
      report.generation.toString(),
      report.result === 'Success' ? 'success' : `error: ${report.error ?? ''}`,
      answer.report,
    );
  }
  if (answer.installationRequest !== undefined) {
    const outcome = answer.report === undefined ? undefined : REPORT_OUTCOMES[answer.report];
    return installationResponse(answer.installationRequest, outcome);
  }
  return answer.report === undefined ? EMPTY_RESPONSE : REPORTED_RESPONSES[answer.report];
}

/**
 * The answer handing out a pending request: `installation_request` with its
 * generation and this project's `disk_image` member (field 100, with what
 * the installed OS's config drive holds: hostname, SSH keys, network), or its
 * `disk_wipe` (field 101) for a disk wipe, and what
 * became of the report the heartbeat carried (`installation_report_outcome`,
 * this project's field 100 of the answer; none when it carried none): an
 * agent reboots into the image it reported only when told ACCEPTED (or,
 * from a server that predates the field, UNSPECIFIED).
 */
export function installationResponse(
  pending: PendingOSInstallation,
  outcome: ReportOutcome | undefined,
): HeartbeatResponse {
  return create(HeartbeatResponseSchema, {
    ...(outcome !== undefined && { installationReportOutcome: outcome }),
    installationRequest: {
      generation: pending.generation,
      type:
        pending.kind === 'DiskWipe'
          ? { case: 'diskWipe', value: {} }
          : {
              case: 'diskImage',
              value: {
                url: pending.imageUrl,
                sha256: pending.imageSha256,
                rootDevice: pending.rootDevice ?? '',
                ...(pending.rootDeviceHints && { rootDeviceHints: hintsMessage(pending.rootDeviceHints) }),
                compression: pending.compression === 'gzip' ? Compression.GZIP : Compression.UNSPECIFIED,
                ...(pending.userData && { userData: pending.userData }),
                hostname: pending.hostname,
                sshPublicKeys: [...pending.sshPublicKeys],
                networkJson: pending.network === undefined ? '' : JSON.stringify(pending.network),
              },
            },
    },
  });
}

/** The request's hints as the protobuf carries them: a hint left out is the empty string or zero. */
function hintsMessage(hints: RootDeviceHints): RootDeviceHintsMessage {
  return create(RootDeviceHintsSchema, {
    deviceName: hints.deviceName ?? '',
    model: hints.model ?? '',
    vendor: hints.vendor ?? '',
    serialNumber: hints.serialNumber ?? '',
    wwn: hints.wwn ?? '',
    minSizeGigabytes: hints.minSizeGigabytes ?? 0,
    ...(hints.rotational !== undefined && { rotational: hints.rotational }),
  });
}

/** `invalid_argument`, as gRPC spells the codes (lower case). */
function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase();
}

/** The log an agent sent, refused if longer than the BMDB keeps or not storable as text. */
function checkedAgentLog(machineId: string, text: string): string {
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > AGENT_LOG_MAX_BYTES) {
    throw new ConnectError(
      `agent_log of machine ${machineId} has ${bytes} bytes, more than ${AGENT_LOG_MAX_BYTES}`,
      Code.InvalidArgument,
    );
  }
  if (text.includes('\0')) {
    throw new ConnectError(`agent_log of machine ${machineId} contains a NUL character`, Code.InvalidArgument);
  }
  return text;
}

function installationReport(machineId: string, report: OSInstallationReportMessage): OSInstallationReport {
  const result = report.result;
  if (result.case === undefined) {
    throw new ConnectError(
      `installation_report of machine ${machineId} has neither success nor error`,
      Code.InvalidArgument,
    );
  }
  const secret = result.case === 'success' ? result.value.bootSecretSha256 : new Uint8Array();
  if (secret.length !== 0 && secret.length !== 32) {
    throw new ConnectError(
      `installation_report of machine ${machineId}: boot_secret_sha256 has ${secret.length} bytes, not 32`,
      Code.InvalidArgument,
    );
  }
  return {
    generation: report.generation,
    result: result.case === 'success' ? 'Success' : 'Error',
    raw: toBinary(OSInstallationReportSchema, report),
    ...(result.case === 'error' && { error: result.value.error }),
    ...(secret.length === 32 && { bootSecretSha256: secret }),
  };
}
