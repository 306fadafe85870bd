import type { BMDB } from '@bmaas/bmdb-controlloop';
import {
  type Batch,
  Batcher,
  type BMDBExtension,
  extensionOf,
  hardwareTotals,
  isConnectionLost,
  retryMetrics,
  withRetry,
} from '@bmaas/bmdb-controlloop/extend';
import { Histogram, type Registry } from 'prom-client';
import {
  type AgentHeartbeat,
  type AgentHeartbeatAnswer,
  type AgentHeartbeatResult,
  checkAgentHeartbeat,
} from './agent-heartbeat-check.js';
import { HEARTBEAT_SQL, type PendingRow } from './sql/agent-heartbeat.js';

/** The answers without a request: most heartbeats get one of these, shared. */
const UNAUTHENTICATED: AgentHeartbeatAnswer = { result: 'unauthenticated' };
const RECORDED: AgentHeartbeatAnswer = { result: 'recorded', installationRequest: undefined, report: undefined };
const REPEATED: AgentHeartbeatAnswer = { result: 'recorded', installationRequest: undefined, report: 'repeated' };

/** Most heartbeats in one statement. */
const MAX_BATCH = 256;

/** The processor heartbeat statements are counted under in the transaction metrics. */
const PROCESSOR = 'agent-callback';

/** Each BMDB's agent heartbeats: every caller on one connection shares its batches. */
const perConnection = new WeakMap<BMDB, AgentHeartbeats>();

/**
 * Records agent heartbeats in the BMDB, batched: the heartbeats arriving
 * while one statement is in flight go together in the next (see `Batcher`),
 * so a server taking thousands of heartbeats a second spends one statement
 * per batch, not a transaction per heartbeat. A batch holds at most one
 * heartbeat per machine, so that its writes never meet on a row. Needs no
 * session: a heartbeat claims nothing.
 *
 * @example
 * ```ts
 * const heartbeats = AgentHeartbeats.of(bmdb);
 * const { result } = await heartbeats.answer({ machineId, publicKey });
 * ```
 */
export class AgentHeartbeats {
  readonly #batcher = new Batcher<AgentHeartbeat, AgentHeartbeatAnswer>({ maxSize: MAX_BATCH, onePerMachine: true });
  /** Heartbeats per heartbeat statement (`bmdb_agent_heartbeat_batch_size`); its count is the statements sent. */
  readonly #batchSize: Histogram | undefined;

  private constructor(private readonly connection: BMDBExtension) {
    this.#batchSize = connection.registry && batchSizeHistogram(connection.registry);
  }

  /**
   * The agent heartbeats of `bmdb`, made on first use (registering
   * `bmdb_agent_heartbeat_batch_size` on its registry, if it has one).
   *
   * @throws {@link ConnectionClosedError} once `bmdb` is closed
   */
  static of(bmdb: BMDB): AgentHeartbeats {
    let heartbeats = perConnection.get(bmdb);
    if (heartbeats === undefined) {
      const connection = extensionOf(bmdb);
      connection.assertOpen();
      heartbeats = new AgentHeartbeats(connection);
      perConnection.set(bmdb, heartbeats);
    }
    return heartbeats;
  }

  /**
   * Records an agent's heartbeat if `heartbeat.publicKey` is the
   * `agent_public_key` of the machine's AgentStarted tag: AgentHeartbeat set
   * to the database's now, and the hardware report it carries stored as the
   * machine's tag (`hardwareReport`), its installation report too when it
   * answers the machine's current request (`osInstallationReport`; see
   * {@link AgentHeartbeats.answer}). Otherwise (no such machine, no
   * AgentStarted tag, another key) nothing is written.
   *
   * @throws {@link BMDBError} for a machine ID that is not a UUID or an empty
   *   key (nothing is sent); {@link ConnectionClosedError} once the BMDB is
   *   closed; the database's error if the statement failed
   */
  async record(heartbeat: AgentHeartbeat): Promise<AgentHeartbeatResult> {
    return (await this.answer(heartbeat)).result;
  }

  /**
   * {@link AgentHeartbeats.record}, with what to answer the agent: the
   * machine's pending OS installation request, handed out (and marked
   * `Delivered` the first time) by the same statement that records the
   * heartbeat. An installation report of the request's generation is
   * stored and settles it (`Succeeded`: the machine's agent tags go, as it
   * now runs its OS; `Failed`: with the agent's error); a report of any
   * other generation is ignored, and the answer says which (`report`). A
   * `Success` report sent again by the agent that sent it (its answer was
   * lost) is answered as the first was, until the machine's next request.
   * No request is handed out while a recovery of the machine is under way,
   * nor while an operator holds it unless delivered already (a hold keeps an
   * installation from starting, not from finishing), nor to a heartbeat
   * reporting `Success` of another generation (its agent may reboot into
   * that image whatever the answer). While an agent boot of the machine is
   * under way (a `ShepherdAgentBoot` work row), no request is handed out and
   * no report stored (`ignored`): the machine is about to be reset into a
   * new agent.
   *
   * @throws {@link BMDBError} as `record`
   */
  answer(heartbeat: AgentHeartbeat): Promise<AgentHeartbeatAnswer> {
    // Not an async function (one promise per heartbeat, not two), so a refusal is rejected by hand, as one would be.
    try {
      this.connection.assertOpen();
      checkAgentHeartbeat(heartbeat);
    } catch (error) {
      return Promise.reject(error);
    }
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
    this.#batchSize?.observe(heartbeats.length);
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
        this.connection.statements.query<{
          authenticated: number[];
          repeated: number[];
          stored: number[];
          pending: PendingRow[] | null;
        }>(query),
      retryMetrics(this.connection.metrics, [PROCESSOR]),
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

/** `bmdb_agent_heartbeat_batch_size` on `registry`: the one there, as BMDB connections in one process may share a registry. */
function batchSizeHistogram(registry: Registry): Histogram {
  const name = 'bmdb_agent_heartbeat_batch_size';
  return (
    (registry.getSingleMetric(name) as Histogram | undefined) ??
    new Histogram({
      name,
      help: 'Agent heartbeats checked and recorded by one statement.',
      buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256],
      registers: [registry],
    })
  );
}
