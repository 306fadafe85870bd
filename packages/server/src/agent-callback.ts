import { performance } from 'node:perf_hooks';
import { type BMDB, isMachineId, type OSInstallationReport } from '@bmaas/bmdb-controlloop';
import { create, toBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import {
  type AgentCallback,
  AgentHardwareReportSchema,
  type HeartbeatRequest,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
  OSInstallationReportSchema,
} from './gen/cloud/bmaas/server/api/agent_pb.js';
import { log } from './log.js';
import type { ServerMetrics } from './metrics.js';
import { peerKey } from './peer-key.js';

/**
 * The same answer for every refused agent, as upstream: whether the machine
 * exists is not told to whoever cannot prove to be its agent.
 */
const UNAUTHENTICATED = 'machine id or public key unknown';

/**
 * AgentCallback over the BMDB. A heartbeat is accepted only from the agent
 * holding the key of its machine's AgentStarted tag (the key of its TLS
 * client certificate); it sets AgentHeartbeat to the database's now and
 * stores the reports it carries. The answer never carries an installation
 * request: OS installation is not part of the shepherd yet.
 */
export function agentCallback(bmdb: BMDB, metrics: ServerMetrics | undefined): ServiceImpl<typeof AgentCallback> {
  // Label children bound once: thousands of heartbeats a second need not hash their labels each.
  const ok = metrics?.requests.labels({ method: 'Heartbeat', code: 'ok' });
  const duration = metrics?.duration.labels({ method: 'Heartbeat' });
  return {
    async heartbeat(request: HeartbeatRequest, context: HandlerContext): Promise<HeartbeatResponse> {
      const started = performance.now();
      try {
        const response = await heartbeat(bmdb, request, context);
        ok?.inc();
        return response;
      } catch (error) {
        const code = error instanceof ConnectError ? codeName(error.code) : 'unknown';
        metrics?.requests.inc({ method: 'Heartbeat', code });
        throw error;
      } finally {
        duration?.observe((performance.now() - started) / 1000);
      }
    },
  };
}

/** Every answer is the same empty one (no installation request); never changed, so shared. */
const EMPTY_RESPONSE: HeartbeatResponse = create(HeartbeatResponseSchema);

async function heartbeat(bmdb: BMDB, request: HeartbeatRequest, context: HandlerContext): Promise<HeartbeatResponse> {
  const key = context.values.get(peerKey);
  if (key === undefined) {
    log.heartbeat('refused a heartbeat for machine %o: no client certificate over an ed25519 key', request.machineId);
    throw new ConnectError(`${UNAUTHENTICATED}: no client certificate over an ed25519 key`, Code.Unauthenticated);
  }
  if (!isMachineId(request.machineId)) {
    throw new ConnectError(`machine_id ${JSON.stringify(request.machineId)} is not a UUID`, Code.InvalidArgument);
  }
  let result: Awaited<ReturnType<BMDB['recordAgentHeartbeat']>>;
  try {
    result = await bmdb.recordAgentHeartbeat({
      machineId: request.machineId,
      publicKey: key,
      ...(request.hardwareReport && {
        hardwareReport: toBinary(AgentHardwareReportSchema, request.hardwareReport),
      }),
      ...(request.installationReport && { installationReport: installationReport(request) }),
    });
  } catch (error) {
    if (error instanceof ConnectError) throw error;
    log.server('could not record a heartbeat of machine %s: %s', request.machineId, (error as Error).message);
    throw new ConnectError(`could not record the heartbeat of machine ${request.machineId}`, Code.Unavailable);
  }
  if (result === 'unauthenticated') {
    log.heartbeat(
      'refused a heartbeat for machine %s: key %s is not its agent’s',
      request.machineId,
      Buffer.from(key).toString('hex'),
    );
    throw new ConnectError(UNAUTHENTICATED, Code.Unauthenticated);
  }
  return EMPTY_RESPONSE;
}

/** `invalid_argument`, as gRPC spells the codes (lower case). */
function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, '$1_$2').toLowerCase();
}

function installationReport(request: HeartbeatRequest): OSInstallationReport {
  const report = request.installationReport;
  if (report === undefined) throw new Error('unreachable: no installation report');
  const result = report.result.case;
  if (result === undefined) {
    throw new ConnectError(
      `installation_report of machine ${request.machineId} has neither success nor error`,
      Code.InvalidArgument,
    );
  }
  return {
    generation: report.generation,
    result: result === 'success' ? 'Success' : 'Error',
    raw: toBinary(OSInstallationReportSchema, report),
  };
}
