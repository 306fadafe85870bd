import { type RawBuilder, sql } from 'kysely';
import type { TagWrite, TagWrites } from '../tags.js';

/** The channel migration 0002's triggers and the ending statements notify (`MachineChanges` listens). */
export const CHANGES_CHANNEL = 'bmdb_machines_changed';

/*
 * The statements that end work items: the batched end of `Work.finish`,
 * `fail` and `cancel` (endWorkStatement), and the opening of
 * `finish(fn)`'s transaction (endFinishedStatement); and what the batched
 * end shares with the session close and collection (sql/sessions.ts), the
 * history and the notification of the claims they end.
 */

/** The end of one work item, as the end statement takes it. */
export interface EndRequest {
  readonly machineId: string;
  readonly process: string;
  readonly sessionId: string;
  /** Metrics label of the session. */
  readonly processor: string;
  readonly event: 'Finished' | 'Failed' | 'Canceled';
  /** Failed: the cause, and the backoff interval to start. */
  readonly failure?: { readonly cause: string; readonly backoffSeconds: number };
  /** Finished: tags to write on the machine. */
  readonly tags?: TagWrites;
}

/**
 * The parts of an end statement, one bit each: what some request of a
 * batch needs done besides deleting its work row and recording history.
 */
const Part = {
  backoffCleared: 1 << 0,
  backoffStarted: 1 << 1,
  startedSet: 1 << 2,
  startedDeleted: 1 << 3,
  heartbeatSet: 1 << 4,
  heartbeatDeleted: 1 << 5,
  notified: 1 << 6,
} as const;

/** The CTE of each part, in the order the statement runs them. */
const PART_CTES: readonly (readonly [number, string])[] = [
  [
    Part.backoffCleared,
    `backoff_cleared AS (
    DELETE FROM work_backoff b USING released r
    WHERE b.machine_id = ANY (ARRAY(SELECT machine_id FROM released WHERE event = 'Finished'))
      AND r.event = 'Finished' AND b.machine_id = r.machine_id AND b.process = r.process)`,
  ],
  [
    Part.backoffStarted,
    `backoff_started AS (
    INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
    SELECT machine_id, process, now() + make_interval(secs => backoff_seconds), cause, backoff_seconds
    FROM released WHERE event = 'Failed'
    ON CONFLICT (machine_id, process) DO UPDATE
    SET until = excluded.until, cause = excluded.cause, last_interval_seconds = excluded.last_interval_seconds)`,
  ],
  [
    Part.startedSet,
    `started_set AS (
    INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
    SELECT machine_id, coalesce(started_at, now()), decode(started_key, 'hex')
    FROM released WHERE event = 'Finished' AND started = 'set'
    ON CONFLICT (machine_id) DO UPDATE
    SET agent_started_at = excluded.agent_started_at, agent_public_key = excluded.agent_public_key)`,
  ],
  [
    Part.startedDeleted,
    `started_deleted AS (
    DELETE FROM machine_agent_started a
    WHERE a.machine_id = ANY (ARRAY(SELECT machine_id FROM released WHERE event = 'Finished' AND started = 'delete')))`,
  ],
  [
    Part.heartbeatSet,
    `heartbeat_set AS (
    INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
    -- Never later than the database's now (see setAgentHeartbeat).
    SELECT machine_id, least(coalesce(heartbeat_at, now()), now())
    FROM released WHERE event = 'Finished' AND heartbeat = 'set'
    ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at)`,
  ],
  [
    Part.heartbeatDeleted,
    `heartbeat_deleted AS (
    DELETE FROM machine_agent_heartbeat h
    WHERE h.machine_id = ANY (ARRAY(SELECT machine_id FROM released WHERE event = 'Finished' AND heartbeat = 'delete')))`,
  ],
  [Part.notified, notifiedOfReleased(" WHERE event = 'Canceled'")],
];

/** The parts `request` needs. */
function partsOf(request: EndRequest): number {
  switch (request.event) {
    case 'Canceled':
      return Part.notified;
    case 'Failed':
      return Part.backoffStarted;
    case 'Finished': {
      const started = request.tags?.agentStarted?.op;
      const heartbeat = request.tags?.agentHeartbeat?.op;
      return (
        Part.backoffCleared |
        (started === 'set' ? Part.startedSet : started === 'delete' ? Part.startedDeleted : 0) |
        (heartbeat === 'set' ? Part.heartbeatSet : heartbeat === 'delete' ? Part.heartbeatDeleted : 0)
      );
    }
  }
}

/**
 * The end statement of a batch needing `parts`. For each request whose
 * work row this session still holds — while the session lives, except for a
 * cancel — it deletes the row, records the history event, clears (Finished)
 * or starts (Failed) the pair's backoff, and writes the finish's tags; a
 * cancel announces the machine free again. It returns the positions of the
 * requests ended: the others' claims were gone.
 *
 * Only the parts some request of the batch needs are in the statement: a
 * data-modifying CTE costs its executor set-up and its table's statement
 * triggers even when it touches no row, and a lone worker's finish needs
 * two of the seven (clear a backoff, set a tag). Each combination is its own prepared statement; a
 * connection holds at most 2^7 of them, and a loop's few.
 *
 * Every table is reached through keys of the batch (`= ANY (...)`), so that
 * its one generic plan (made perhaps when a table was empty) never scans a
 * table that has grown since.
 *
 * One statement at READ COMMITTED: everything it does hangs on the work row
 * it deletes, which it locks. A concurrent takeover or collection of the same
 * row either committed first (the row is re-checked, no longer ours, and the
 * request is not ended) or waits for this statement.
 */
export function endWorkStatement(parts: number): string {
  const ctes = PART_CTES.filter(([part]) => parts & part).map(([, cte]) => `,\n  ${cte}`);
  const notified = parts & Part.notified ? '(SELECT count(*)::int FROM notified)' : '0';
  return `
  WITH requests AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::int[],
                         $7::text[], $8::text[], $9::timestamptz[], $10::text[], $11::timestamptz[])
      WITH ORDINALITY AS r (machine_id, process, session_id, event, cause, backoff_seconds,
                            started, started_key, started_at, heartbeat, heartbeat_at, ord)),
  released AS (
    DELETE FROM work w USING requests r, sessions s
    WHERE w.machine_id = ANY ($1::uuid[]) AND s.session_id = ANY ($3::uuid[])
      AND w.machine_id = r.machine_id AND w.process = r.process AND w.session_id = r.session_id
      AND s.session_id = w.session_id AND (r.event = 'Canceled' OR s.deadline > now())
    RETURNING r.*),
  ${historyOfReleased('event', 'now()', 'cause')}${ctes.join('')}
  SELECT coalesce(array_agg(ord::int), '{}') AS released, ${notified} AS notified
  FROM released`;
}

/** The parts the statement of a batch of `requests` needs: what any of them needs. */
export function partsOfBatch(requests: readonly EndRequest[]): number {
  let parts = 0;
  for (const request of requests) parts |= partsOf(request);
  return parts;
}

/** The parameters of {@link endWorkStatement} for `requests`: one array per column, `$1` to `$11`. */
export function endWorkParameters(requests: readonly EndRequest[]): unknown[] {
  const started = requests.map((r) => r.tags?.agentStarted);
  const heartbeat = requests.map((r) => r.tags?.agentHeartbeat);
  return [
    requests.map((r) => r.machineId),
    requests.map((r) => r.process),
    requests.map((r) => r.sessionId),
    requests.map((r) => r.event),
    // PostgreSQL's text cannot hold NUL; an error message might.
    requests.map((r) => r.failure?.cause.replaceAll('\u0000', '\uFFFD') ?? null),
    requests.map((r) => r.failure?.backoffSeconds ?? null),
    started.map(op),
    started.map((w) => (w?.publicKey ? Buffer.from(w.publicKey).toString('hex') : null)),
    started.map(at),
    heartbeat.map(op),
    heartbeat.map(at),
  ];
}

const op = (write: TagWrite | undefined) => write?.op ?? null;
const at = (write: TagWrite | undefined) => write?.at?.toISOString() ?? null;

/** SQLSTATE raised by `bmdb_work_lost()` (migration 0002) when an end finds no claim. */
export const WORK_LOST = 'BMW01';

/**
 * Deletes `sessionId`'s work row of (`machineId`, `process`), only while
 * the session is alive in the database, writes `Finished` and clears the
 * backoff, in one statement: the opening of `Work.finish(fn)`'s transaction. If the row is gone, the
 * database raises {@link WORK_LOST}.
 *
 * Values are inlined as literals, so the statement can share one round trip
 * with the `BEGIN` before it (a simple query may hold several statements;
 * one with parameters may not).
 */
export function endFinishedStatement(machineId: string, process: string, sessionId: string): RawBuilder<unknown> {
  const machine = sql.lit(machineId);
  const processLiteral = sql.lit(process);
  const session = sql.lit(sessionId);
  return sql`
      WITH released AS (
        DELETE FROM work w USING sessions s
        WHERE w.machine_id = ${machine}::uuid AND w.process = ${processLiteral}
          AND w.session_id = ${session}::uuid
          AND s.session_id = w.session_id AND s.deadline > now()
        RETURNING w.machine_id, w.process),
      history AS (
        INSERT INTO work_history (machine_id, process, event, "timestamp")
        SELECT machine_id, process, 'Finished', now() FROM released),
      backoff AS (
        DELETE FROM work_backoff b USING released r WHERE b.machine_id = r.machine_id AND b.process = r.process)
      SELECT bmdb_work_lost(${machine}::uuid, ${processLiteral}, ${session}::uuid)
      WHERE (SELECT count(*) FROM released) <> 1`;
}

/*
 * What every statement that ends claims in batches writes the same way,
 * once: the batch end (above) and the session close and collection
 * (sql/sessions.ts). Both read a CTE `released` of the work rows they
 * deleted, with `machine_id` and `process`. Plain text, not kysely's `sql`,
 * because the batch statement is text, prepared under a name made from it.
 */

/**
 * The CTE `history`: one event per row of `released`, each argument an SQL
 * expression over `released`'s columns (`event`, `now()`, `cause`).
 */
export function historyOfReleased(event: string, at: string, cause: string): string {
  return `history AS (
    INSERT INTO work_history (machine_id, process, event, "timestamp", failed_cause)
    SELECT machine_id, process, ${event}, ${at}, ${cause} FROM released)`;
}

/**
 * The CTE `notified`: machines whose claim was canceled are eligible again at
 * once (a finish or failure leaves them tagged or backed off). `where`
 * narrows `released` to the canceled rows (empty when all are). It runs only
 * when the statement's final SELECT reads it, and notifies only if such a
 * row exists.
 */
export function notifiedOfReleased(where: string): string {
  return `notified AS (
    SELECT pg_notify('${CHANGES_CHANNEL}', 'work')
    FROM (SELECT 1 FROM released${where} LIMIT 1) c)`;
}
