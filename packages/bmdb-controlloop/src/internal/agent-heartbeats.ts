import type { AgentHeartbeat, AgentHeartbeatAnswer } from '../agent-heartbeat-check.js';
import { hardwareTotals } from '../hardware-totals.js';
import type { BMDBMetrics } from '../metrics.js';
import { HEARTBEAT_SQL, type PendingRow } from '../sql/agent-heartbeat.js';
import { type Batch, Batcher } from './batcher.js';
import { isConnectionLost } from './connection-lost.js';
import type { PreparedStatements } from './prepared.js';
import { withRetry } from './retry.js';
import { retryMetrics } from './retry-metrics.js';

/** The answers without a request: most heartbeats get one of these, shared. */
const UNAUTHENTICATED: AgentHeartbeatAnswer = { result: 'unauthenticated' };
const RECORDED: AgentHeartbeatAnswer = { result: 'recorded', installationRequest: undefined, report: undefined };
const REPEATED: AgentHeartbeatAnswer = { result: 'recorded', installationRequest: undefined, report: 'repeated' };

/** Most heartbeats in one statement. */
const MAX_BATCH = 256;

/** The processor heartbeat statements are counted under in the transaction metrics. */
const PROCESSOR = 'agent-callback';

/**
 * Records agent heartbeats, batched: the heartbeats arriving while one
 * statement is in flight go together in the next (see {@link Batcher}), so
 * authenticating and recording costs one statement per batch, not a
 * transaction per heartbeat. A batch holds at most one heartbeat per
 * machine, so that its writes never meet on a row.
 */
export class AgentHeartbeats {
  readonly #batcher = new Batcher<AgentHeartbeat, AgentHeartbeatAnswer>({ maxSize: MAX_BATCH, onePerMachine: true });

  constructor(
    private readonly prepared: PreparedStatements,
    private readonly metrics: BMDBMetrics | undefined,
  ) {}

  record(heartbeat: AgentHeartbeat): Promise<AgentHeartbeatAnswer> {
    const answer = this.#batcher.submit(heartbeat);
    if (!this.#batcher.sending) void this.#sendBatches();
    return answer;
  }

  /** Sends the queued heartbeats, a batch at a time, until none is left; never rejects. */
  async #sendBatches(): Promise<void> {
    for await (const batch of this.#batcher.batches()) await this.#sendBatch(batch);
  }

  /**
   * Sends one batch and answers its heartbeats. A batch that failed for
   * anything but a lost connection (one heartbeat's bad value) is sent again
   * heartbeat by heartbeat, so that it fails only that one.
   */
  async #sendBatch(batch: Batch<AgentHeartbeat, AgentHeartbeatAnswer>): Promise<void> {
    try {
      batch.resolve(await this.#send(batch.items));
    } catch (error) {
      if (batch.items.length === 1 || isConnectionLost(error)) batch.reject(error);
      else for (const one of batch.isolated()) await this.#sendBatch(one);
    }
  }

  async #send(heartbeats: readonly AgentHeartbeat[]): Promise<AgentHeartbeatAnswer[]> {
    this.metrics?.agentHeartbeatBatchSize.observe(heartbeats.length);
    // Each report's totals, for the fleet's hardware gauges; null where it cannot be read.
    const totals = heartbeats.map((h) => (h.hardwareReport ? hardwareTotals(h.hardwareReport) : undefined));
    const parameters = [
      heartbeats.map((h) => h.machineId),
      heartbeats.map((h) => Buffer.from(h.publicKey)),
      heartbeats.map((h) => (h.hardwareReport ? Buffer.from(h.hardwareReport) : null)),
      heartbeats.map((h) => h.installationReport?.generation.toString() ?? null),
      heartbeats.map((h) => h.installationReport?.result ?? null),
      heartbeats.map((h) => (h.installationReport ? Buffer.from(h.installationReport.raw) : null)),
      heartbeats.map((h) => h.installationReport?.error ?? null),
      totals.map((t) => t?.cpuThreads ?? null),
      totals.map((t) => t?.memoryBytes ?? null),
      totals.map((t) => t?.disks ?? null),
      totals.map((t) => t?.diskBytes ?? null),
      heartbeats.map((h) => h.agentLog ?? null),
      heartbeats.map((h) => {
        const secret = h.installationReport?.bootSecretSha256;
        return secret === undefined || secret.length === 0 ? null : Buffer.from(secret);
      }),
    ];
    const query = { sql: HEARTBEAT_SQL, parameters };
    const rows = await withRetry(
      () =>
        this.prepared.query<{
          authenticated: number[];
          repeated: number[];
          stored: number[];
          pending: PendingRow[] | null;
        }>(query),
      retryMetrics(this.metrics, [PROCESSOR]),
    );
    const [row] = rows;
    const authenticated = new Set(row?.authenticated ?? []);
    const repeated = new Set(row?.repeated ?? []);
    const stored = new Set(row?.stored ?? []);
    const pending = new Map((row?.pending ?? []).map((p) => [p.ord, p]));
    return heartbeats.map((heartbeat, i) => {
      if (repeated.has(i + 1)) return REPEATED;
      if (!authenticated.has(i + 1)) return UNAUTHENTICATED;
      const report = heartbeat.installationReport === undefined ? undefined : stored.has(i + 1) ? 'stored' : 'ignored';
      const request = pending.get(i + 1);
      if (request === undefined) return report === undefined ? RECORDED : { ...RECORDED, report };
      return {
        result: 'recorded',
        report,
        installationRequest: {
          generation: BigInt(request.generation),
          kind: request.kind,
          imageUrl: request.imageUrl ?? '',
          imageSha256: request.imageSha256 ?? '',
          rootDevice: request.rootDevice ?? undefined,
          rootDeviceHints: request.rootDeviceHints ?? undefined,
          compression: request.compression,
          userData: request.userData === null ? undefined : Buffer.from(request.userData, 'base64'),
          hostname: request.hostname ?? '',
          sshPublicKeys: request.sshPublicKeys,
          network: request.network ?? undefined,
        },
      };
    });
  }
}
