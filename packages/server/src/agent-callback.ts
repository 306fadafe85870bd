import { performance } from 'node:perf_hooks';
import { type BMDB, isMachineId, type OSInstallationReport, type PendingOSInstallation } from '@bmaas/bmdb-controlloop';
import { create, type MessageInitShape, toBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, type ServiceImpl } from '@connectrpc/connect';
import * as agentApi from './gen/cloud/agent/api/agent_pb.js';
import {
  DiskImageInstallationRequest_Compression as Compression,
  type DiskImageInstallationRequestSchema,
} from './gen/cloud/agent/api/disk_image_pb.js';
import * as bmaasApi from './gen/cloud/bmaas/server/api/agent_pb.js';
import { log } from './log.js';
import type { ServerMetrics } from './metrics.js';
import { peerKey } from './peer-key.js';

/**
 * The same answer for every refused agent, as upstream: whether the machine
 * exists is not told to whoever cannot prove to be its agent.
 */
const UNAUTHENTICATED = 'machine id or public key unknown';

/** A heartbeat as both names of the API carry it, decoded into what the BMDB records. */
export interface DecodedHeartbeat {
  readonly machineId: string;
  /** The serialized AgentHardwareReport, if sent. */
  readonly hardwareReport: Uint8Array | undefined;
  readonly installationReport: OSInstallationReport | undefined;
}

/** An installation report as both generated APIs type it. */
interface ReportMessage {
  readonly generation: bigint;
  readonly result:
    | { readonly case: 'success'; readonly value: unknown }
    | { readonly case: 'error'; readonly value: { readonly error: string } }
    | { readonly case: undefined; readonly value?: undefined };
}

/**
 * AgentCallback over the BMDB, under both its service names:
 * `cloud.bmaas.server.api.AgentCallback` (upstream until 2025) and
 * `cloud.agent.api.AgentCallback` (the current upstream agent's), the same
 * messages on the wire. A heartbeat is accepted only from the agent holding
 * the key of its machine's AgentStarted tag (the key of its TLS client
 * certificate); it sets AgentHeartbeat to the database's now and stores the
 * reports it carries, and the answer carries the machine's pending OS
 * installation request (see `BMDB.answerAgentHeartbeat`).
 */
export function agentCallbacks(
  bmdb: BMDB,
  metrics: ServerMetrics | undefined,
): {
  readonly bmaas: ServiceImpl<typeof bmaasApi.AgentCallback>;
  readonly agent: ServiceImpl<typeof agentApi.AgentCallback>;
} {
  // Label children bound once: thousands of heartbeats a second need not hash their labels each.
  const ok = metrics?.requests.labels({ method: 'Heartbeat', code: 'ok' });
  const duration = metrics?.duration.labels({ method: 'Heartbeat' });
  const measured = async <T>(answer: () => Promise<T>): Promise<T> => {
    const started = performance.now();
    try {
      const response = await answer();
      ok?.inc();
      return response;
    } catch (error) {
      const code = error instanceof ConnectError ? codeName(error.code) : 'unknown';
      metrics?.requests.inc({ method: 'Heartbeat', code });
      throw error;
    } finally {
      duration?.observe((performance.now() - started) / 1000);
    }
  };
  return {
    bmaas: {
      heartbeat: (request, context) =>
        measured(async () =>
          bmaasResponse(await heartbeat(bmdb, decodeBmaasHeartbeat(request), context.values.get(peerKey))),
        ),
    },
    agent: {
      heartbeat: (request, context) =>
        measured(async () =>
          agentResponse(await heartbeat(bmdb, decodeAgentHeartbeat(request), context.values.get(peerKey))),
        ),
    },
  };
}

/**
 * Records one heartbeat (the agent's `key` from its TLS client
 * certificate) and returns the installation request to answer it with.
 * Shared by every way a heartbeat arrives; each encodes the answer itself
 * ({@link bmaasResponse}, {@link agentResponse}).
 *
 * @throws ConnectError UNAUTHENTICATED (no key, or not the machine's
 *   agent's), INVALID_ARGUMENT (a machine ID that is no UUID), UNAVAILABLE
 *   (the BMDB could not record it)
 */
export async function heartbeat(
  bmdb: BMDB,
  request: DecodedHeartbeat,
  key: Uint8Array | undefined,
): Promise<PendingOSInstallation | undefined> {
  if (key === undefined) {
    log.heartbeat('refused a heartbeat for machine %o: no client certificate over an ed25519 key', request.machineId);
    throw new ConnectError(`${UNAUTHENTICATED}: no client certificate over an ed25519 key`, Code.Unauthenticated);
  }
  if (!isMachineId(request.machineId)) {
    throw new ConnectError(`machine_id ${JSON.stringify(request.machineId)} is not a UUID`, Code.InvalidArgument);
  }
  let answer: Awaited<ReturnType<BMDB['answerAgentHeartbeat']>>;
  try {
    answer = await bmdb.answerAgentHeartbeat({
      machineId: request.machineId,
      publicKey: key,
      ...(request.hardwareReport && { hardwareReport: request.hardwareReport }),
      ...(request.installationReport && { installationReport: request.installationReport }),
    });
  } catch (error) {
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
  if (request.installationReport) {
    const report = request.installationReport;
    log.heartbeat(
      'machine %s reported installation generation %s: %s',
      request.machineId,
      report.generation,
      report.result === 'Success' ? 'success' : `error: ${report.error ?? ''}`,
    );
  }
  return answer.installationRequest;
}

/** A heartbeat under `cloud.bmaas.server.api`, decoded: the reports serialized as the BMDB keeps them. */
export function decodeBmaasHeartbeat(request: bmaasApi.HeartbeatRequest): DecodedHeartbeat {
  const report = request.installationReport;
  return {
    machineId: request.machineId,
    hardwareReport: request.hardwareReport && toBinary(bmaasApi.AgentHardwareReportSchema, request.hardwareReport),
    installationReport:
      report && installationReport(request.machineId, report, toBinary(bmaasApi.OSInstallationReportSchema, report)),
  };
}

/** A heartbeat under `cloud.agent.api`, decoded: the same bytes as under the older name. */
export function decodeAgentHeartbeat(request: agentApi.HeartbeatRequest): DecodedHeartbeat {
  const report = request.installationReport;
  return {
    machineId: request.machineId,
    hardwareReport: request.hardwareReport && toBinary(agentApi.AgentHardwareReportSchema, request.hardwareReport),
    installationReport:
      report && installationReport(request.machineId, report, toBinary(agentApi.OSInstallationReportSchema, report)),
  };
}

/** @throws ConnectError INVALID_ARGUMENT for a report with neither success nor error */
function installationReport(machineId: string, report: ReportMessage, raw: Uint8Array): OSInstallationReport {
  const result = report.result;
  if (result.case === undefined) {
    throw new ConnectError(
      `installation_report of machine ${machineId} has neither success nor error`,
      Code.InvalidArgument,
    );
  }
  return {
    generation: report.generation,
    result: result.case === 'success' ? 'Success' : 'Error',
    raw,
    ...(result.case === 'error' && { error: result.value.error }),
  };
}

/** Answers without a request, never changed, so shared. */
const EMPTY_BMAAS: bmaasApi.HeartbeatResponse = create(bmaasApi.HeartbeatResponseSchema);
const EMPTY_AGENT: agentApi.HeartbeatResponse = create(agentApi.HeartbeatResponseSchema);

/** The answer under `cloud.bmaas.server.api`. */
export function bmaasResponse(pending: PendingOSInstallation | undefined): bmaasApi.HeartbeatResponse {
  if (pending === undefined) return EMPTY_BMAAS;
  return create(bmaasApi.HeartbeatResponseSchema, {
    installationRequest: { generation: pending.generation, type: { case: 'diskImage', value: diskImage(pending) } },
  });
}

/** The answer under `cloud.agent.api`. */
export function agentResponse(pending: PendingOSInstallation | undefined): agentApi.HeartbeatResponse {
  if (pending === undefined) return EMPTY_AGENT;
  return create(agentApi.HeartbeatResponseSchema, {
    installationRequest: { generation: pending.generation, type: { case: 'diskImage', value: diskImage(pending) } },
  });
}

function diskImage(pending: PendingOSInstallation): MessageInitShape<typeof DiskImageInstallationRequestSchema> {
  return {
    url: pending.imageUrl,
    sha256: pending.imageSha256,
    rootDevice: pending.rootDevice,
    compression: pending.compression === 'gzip' ? Compression.GZIP : Compression.UNSPECIFIED,
    ...(pending.userData && { userData: pending.userData }),
  };
}

/** `invalid_argument`, as gRPC spells the codes (lower case). */
function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase();
}
