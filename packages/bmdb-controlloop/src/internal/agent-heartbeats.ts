import type { AgentHeartbeat, AgentHeartbeatResult } from '../agent-heartbeat.js';
import { Batcher } from './batcher.js';
import { hardwareTotals } from './hardware-totals.js';
import { onePerMachine } from './machine-batches.js';
import type { PreparedStatements } from './prepared.js';
import type { RunStatement } from './retry.js';

/** Most heartbeats in one statement. */
const MAX_BATCH = 256;

/** The processor heartbeat statements are counted under in the transaction metrics. */
const PROCESSOR = 'agent-callback';

/**
 * The heartbeats of a batch, one array element per heartbeat. The statement
 * keeps those whose machine has an AgentStarted tag with the same public key
 * (`authenticated`), and for each sets AgentHeartbeat to now and stores the
 * reports sent (a hardware report with its totals, for the fleet gauges); it
 * returns their positions. A heartbeat with an unknown machine or another key
 * writes nothing.
 *
 * `FOR KEY SHARE` holds the AgentStarted row until the statement ends, so a
 * recovery deleting it either committed first (the row is re-checked, gone,
 * and the heartbeat refused) or waits: a heartbeat never lands on a machine
 * whose agent was just written off.
 *
 * One statement at READ COMMITTED, every table reached through keys of the
 * batch, planned once (see sql/end-work.ts).
 */
const HEARTBEAT_SQL = `
  WITH requests AS (
    SELECT * FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::bigint[], $5::text[], $6::bytea[],
                         $7::bigint[], $8::bigint[], $9::int[], $10::bigint[])
      WITH ORDINALITY AS r (machine_id, public_key, hardware_report, generation, result, installation_report,
                            cpu_threads, memory_bytes, disks, disk_bytes, ord)),
  authenticated AS (
    SELECT r.* FROM requests r JOIN machine_agent_started a ON a.machine_id = r.machine_id
    WHERE a.machine_id = ANY ($1::uuid[]) AND a.agent_public_key = r.public_key
    FOR KEY SHARE OF a),
  heartbeats AS (
    INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
    SELECT machine_id, now() FROM authenticated
    ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at),
  hardware AS (
    INSERT INTO machine_hardware_report
      (machine_id, hardware_report_raw, hardware_reported_at, cpu_threads, memory_bytes, disks, disk_bytes)
    SELECT machine_id, hardware_report, now(), cpu_threads, memory_bytes, disks, disk_bytes
    FROM authenticated WHERE hardware_report IS NOT NULL
    ON CONFLICT (machine_id) DO UPDATE
    SET hardware_report_raw = excluded.hardware_report_raw, hardware_reported_at = excluded.hardware_reported_at,
        cpu_threads = excluded.cpu_threads, memory_bytes = excluded.memory_bytes, disks = excluded.disks,
        disk_bytes = excluded.disk_bytes),
  installation AS (
    INSERT INTO machine_os_installation_report
      (machine_id, generation, os_installation_result, os_installation_report_raw, os_installation_reported_at)
    SELECT machine_id, generation, result, installation_report, now() FROM authenticated
    WHERE installation_report IS NOT NULL
    ON CONFLICT (machine_id) DO UPDATE
    SET generation = excluded.generation, os_installation_result = excluded.os_installation_result,
        os_installation_report_raw = excluded.os_installation_report_raw,
        os_installation_reported_at = excluded.os_installation_reported_at)
  SELECT coalesce(array_agg(ord::int), '{}') AS authenticated FROM authenticated`;

/**
 * Records agent heartbeats, batched: the heartbeats arriving while one
 * statement is in flight go together in the next (see {@link Batcher}), so
 * authenticating and recording costs one statement per batch, not a
 * transaction per heartbeat. A batch holds at most one heartbeat per
 * machine, so that its writes never meet on a row.
 */
export class AgentHeartbeats {
  readonly #batcher: Batcher<AgentHeartbeat, AgentHeartbeatResult>;

  constructor(
    private readonly prepared: PreparedStatements,
    private readonly run: RunStatement,
    private readonly onBatch: (size: number) => void,
  ) {
    this.#batcher = new Batcher({
      maxSize: MAX_BATCH,
      ...onePerMachine<AgentHeartbeat>(),
      send: (heartbeats) => this.#send(heartbeats),
    });
  }

  record(heartbeat: AgentHeartbeat): Promise<AgentHeartbeatResult> {
    return this.#batcher.submit(heartbeat);
  }

  async #send(heartbeats: readonly AgentHeartbeat[]): Promise<AgentHeartbeatResult[]> {
    this.onBatch(heartbeats.length);
    // Each report's totals, for the fleet's hardware gauges; null where it cannot be read.
    const totals = heartbeats.map((h) => (h.hardwareReport ? hardwareTotals(h.hardwareReport) : undefined));
    const parameters = [
      heartbeats.map((h) => h.machineId),
      heartbeats.map((h) => Buffer.from(h.publicKey)),
      heartbeats.map((h) => (h.hardwareReport ? Buffer.from(h.hardwareReport) : null)),
      heartbeats.map((h) => h.installationReport?.generation.toString() ?? null),
      heartbeats.map((h) => h.installationReport?.result ?? null),
      heartbeats.map((h) => (h.installationReport ? Buffer.from(h.installationReport.raw) : null)),
      totals.map((t) => t?.cpuThreads ?? null),
      totals.map((t) => t?.memoryBytes ?? null),
      totals.map((t) => t?.disks ?? null),
      totals.map((t) => t?.diskBytes ?? null),
    ];
    const [row] = await this.run([PROCESSOR], () =>
      this.prepared.query<{ authenticated: number[] }>({ sql: HEARTBEAT_SQL, parameters }),
    );
    const authenticated = new Set(row?.authenticated ?? []);
    return heartbeats.map((_, i) => (authenticated.has(i + 1) ? 'recorded' : 'unauthenticated'));
  }
}
