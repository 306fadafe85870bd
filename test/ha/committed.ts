/**
 * What the primary had committed before it was killed, read from the BMDB
 * itself: a row a reader saw is a committed row, and with synchronous
 * replication the new primary must still have it.
 */
import pg from 'pg';

/**
 * The rows whose loss a failover must not cause, each as a key: claims and
 * ends (`work_history`), tags (`machine_agent_started`), holds and the
 * operator history, installation requests and reports, and each agent's newest heartbeat
 * (a time the new primary may only have moved forward).
 */
export interface CommittedRows {
  readonly history: ReadonlySet<string>;
  readonly agentStarted: ReadonlySet<string>;
  readonly holds: ReadonlySet<string>;
  readonly operatorHistory: ReadonlySet<string>;
  readonly installationReports: ReadonlySet<string>;
  readonly installationRequests: ReadonlySet<string>;
  /** Machine ID → its agent's last heartbeat, in ms since the epoch. */
  readonly heartbeats: ReadonlyMap<string, number>;
}

/** Reads every committed row of the kinds above in one snapshot. */
export async function readCommitted(client: pg.Client): Promise<CommittedRows> {
  await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
  try {
    const keys = async (text: string) => new Set((await client.query<{ key: string }>(text)).rows.map((r) => r.key));
    const history = await keys(
      `SELECT concat_ws(' ', machine_id, process, event, to_char("timestamp", 'YYYY-MM-DD"T"HH24:MI:SS.US')) AS key
       FROM work_history`,
    );
    const agentStarted = await keys('SELECT machine_id::text AS key FROM machine_agent_started');
    const holds = await keys(`SELECT concat_ws(' ', machine_id, hold_reason) AS key FROM machine_hold`);
    const operatorHistory = await keys(
      `SELECT concat_ws(' ', machine_id, action, outcome, to_char("timestamp", 'YYYY-MM-DD"T"HH24:MI:SS.US')) AS key
       FROM operator_history`,
    );
    const installationReports = await keys(
      `SELECT concat_ws(' ', machine_id, generation) AS key FROM machine_os_installation_report`,
    );
    const installationRequests = await keys(
      `SELECT concat_ws(' ', machine_id, generation) AS key FROM machine_os_installation_request`,
    );
    const { rows } = await client.query<{ machine_id: string; at: number }>(
      `SELECT machine_id, (extract(epoch FROM agent_heartbeat_at) * 1000)::float8 AS at FROM machine_agent_heartbeat`,
    );
    const heartbeats = new Map(rows.map((r) => [r.machine_id, r.at]));
    return {
      history,
      agentStarted,
      holds,
      operatorHistory,
      installationReports,
      installationRequests,
      heartbeats,
    };
  } finally {
    await client.query('COMMIT').catch(() => {});
  }
}

/**
 * Reads {@link readCommitted} again and again on one connection to the
 * primary until {@link stop}; {@link last} is the newest complete reading,
 * all of it committed before the reading ended.
 */
export class CommittedRecorder {
  last: CommittedRows | undefined;
  /** Date.now() when {@link last} was read. */
  lastAt = 0;
  readonly #client: pg.Client;
  #stopped = false;
  #loop: Promise<void> | undefined;

  constructor(url: string) {
    this.#client = new pg.Client({ connectionString: url });
    this.#client.on('error', () => {});
  }

  async start(): Promise<void> {
    await this.#client.connect();
    this.#loop = (async () => {
      while (!this.#stopped) {
        try {
          this.last = await readCommitted(this.#client);
          this.lastAt = Date.now();
        } catch {
          return; // The primary is gone: what was read last stands.
        }
      }
    })();
  }

  /** Stops reading and returns the last reading. */
  async stop(): Promise<CommittedRows> {
    this.#stopped = true;
    await this.#loop;
    await this.#client.end().catch(() => {});
    if (!this.last) throw new Error('the committed rows were never read');
    return this.last;
  }
}

/** The rows of `before` the failover lost: those `after` (read on the new primary) lacks. */
export function lostRows(before: CommittedRows, after: CommittedRows): Record<string, string[]> {
  const missing = (a: ReadonlySet<string>, b: ReadonlySet<string>) => [...a].filter((key) => !b.has(key));
  return {
    history: missing(before.history, after.history),
    agentStarted: missing(before.agentStarted, after.agentStarted),
    holds: missing(before.holds, after.holds),
    operatorHistory: missing(before.operatorHistory, after.operatorHistory),
    installationReports: missing(before.installationReports, after.installationReports),
    installationRequests: missing(before.installationRequests, after.installationRequests),
    heartbeats: [...before.heartbeats]
      .filter(([machine, at]) => (after.heartbeats.get(machine) ?? 0) < at)
      .map(([machine]) => machine),
  };
}
