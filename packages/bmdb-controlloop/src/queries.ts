import { type Kysely, type RawBuilder, sql } from 'kysely';
import type { Database, MachineProvidedRow, ProviderStatus, WorkEvent } from './schema.js';
import { Process, SHEPHERD_PROCESSES } from './schema.js';
import type { Selection } from './selection.js';

/** A machine as its provider knows it: the Provided tag. */
export interface ProvidedMachine {
  readonly machineId: string;
  readonly provider: string;
  readonly providerId: string;
  readonly providerReservationId: string | null;
  readonly providerIpAddress: string | null;
  readonly providerLocation: string | null;
  readonly providerStatus: ProviderStatus | null;
}

/** The Provided tag's fields when adding it. */
export interface NewProvided {
  readonly provider: string;
  readonly providerId: string;
  readonly providerReservationId?: string | null;
  readonly providerIpAddress?: string | null;
  readonly providerLocation?: string | null;
  readonly providerStatus?: ProviderStatus | null;
}

/**
 * Fields of the Provided tag a provider's status updater refreshes. Fields
 * left `undefined` keep their stored value.
 */
export interface ProviderStatusUpdate {
  readonly providerReservationId?: string | null;
  readonly providerIpAddress?: string | null;
  readonly providerLocation?: string | null;
  readonly providerStatus?: ProviderStatus | null;
}

/** One entry of a machine's work history. */
export interface WorkHistoryEntry {
  readonly machineId: string;
  readonly process: string;
  readonly event: WorkEvent;
  readonly timestamp: Date;
  readonly failedCause: string | null;
}

/** A (machine, process) backoff. */
export interface WorkBackoffEntry {
  readonly machineId: string;
  readonly process: string;
  readonly until: Date;
  readonly cause: string;
  readonly lastIntervalSeconds: number | null;
  /** Whether `until` is still in the future (by the database's clock). */
  readonly active: boolean;
}

/** Thresholds after which a started agent counts as lost. Milliseconds. */
export interface RecoveryThresholds {
  /** No first heartbeat this long after the agent started. Default 30 min. */
  readonly firstHeartbeatWithin?: number;
  /** Last heartbeat older than this. Default 10 min. */
  readonly heartbeatWithin?: number;
}

/** Machines per lifecycle stage; each machine counts in exactly one stage. */
export interface FleetStages {
  /** Machines without a Provided tag (rare: a half-created machine). */
  readonly unprovided: number;
  /** Provided, agent not started, no agent start under way. */
  readonly provided: number;
  /** Provided, agent not started, an agent start claimed right now. */
  readonly agentStarting: number;
  /** Agent started, no heartbeat yet, still within the first-heartbeat threshold. */
  readonly agentStarted: number;
  /** Agent heartbeating within the threshold. */
  readonly heartbeating: number;
  /** Agent started but silent past a threshold: a recovery candidate. */
  readonly awaitingRecovery: number;
}

/** The fleet at a glance. */
export interface FleetStats {
  readonly machines: number;
  readonly stages: FleetStages;
  /** Live work items (held by unexpired sessions), per process. */
  readonly activeWork: Readonly<Record<string, number>>;
  /** Backoffs still running, per process. */
  readonly activeBackoffs: Readonly<Record<string, number>>;
}

const MINUTE = 60_000;
const DEFAULT_FIRST_HEARTBEAT_WITHIN = 30 * MINUTE;
const DEFAULT_HEARTBEAT_WITHIN = 10 * MINUTE;

/**
 * Whether the machine at `machineId` (a column reference such as
 * `'mp.machine_id'`) has work of any of `processes` held by a live session.
 * Work of an expired session does not count: its holder is gone.
 *
 * Use it to keep your own selection queries consistent with the shepherd's:
 * `.where(sql<boolean>\`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}\`)`.
 */
export function hasLiveWork(machineId: string, processes: readonly string[]): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (
    SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
    WHERE w.machine_id = ${sql.ref(machineId)}
      AND w.process IN (${sql.join(processes)})
      AND s.deadline > now())`;
}

/** Whether the machine at `machineId` has a running backoff for `process`. */
export function inBackoff(machineId: string, process: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (
    SELECT 1 FROM work_backoff b
    WHERE b.machine_id = ${sql.ref(machineId)} AND b.process = ${process} AND b.until > now())`;
}

/**
 * Typed queries over the machine model, bound to one transaction. Passed to
 * every `Session.transact` callback; `db` is the transaction itself for
 * queries of your own.
 */
export class Queries {
  constructor(
    /** The Kysely transaction these queries run in. */
    readonly db: Kysely<Database>,
  ) {}

  /** Creates a machine and returns its ID. */
  async newMachine(): Promise<string> {
    const row = await this.db.insertInto('machines').defaultValues().returning('machine_id').executeTakeFirstOrThrow();
    return row.machine_id;
  }

  /** Adds the Provided tag: the machine is now known to `provider` as `providerId`. */
  async addProvided(machineId: string, tag: NewProvided): Promise<void> {
    await this.db
      .insertInto('machine_provided')
      .values({
        machine_id: machineId,
        provider: tag.provider,
        provider_id: tag.providerId,
        provider_reservation_id: tag.providerReservationId ?? null,
        provider_ip_address: tag.providerIpAddress ?? null,
        provider_location: tag.providerLocation ?? null,
        provider_status: tag.providerStatus ?? null,
      })
      .execute();
  }

  /**
   * Updates the provider-side facts of the machine `providerId` of `provider`.
   *
   * @returns whether such a machine exists
   */
  async updateProviderStatus(provider: string, providerId: string, update: ProviderStatusUpdate): Promise<boolean> {
    const set: Partial<MachineProvidedRow> = {};
    if (update.providerReservationId !== undefined) set.provider_reservation_id = update.providerReservationId;
    if (update.providerIpAddress !== undefined) set.provider_ip_address = update.providerIpAddress;
    if (update.providerLocation !== undefined) set.provider_location = update.providerLocation;
    if (update.providerStatus !== undefined) set.provider_status = update.providerStatus;
    if (Object.keys(set).length === 0) {
      const found = await this.db
        .selectFrom('machine_provided')
        .select('machine_id')
        .where('provider', '=', provider)
        .where('provider_id', '=', providerId)
        .executeTakeFirst();
      return found !== undefined;
    }
    const result = await this.db
      .updateTable('machine_provided')
      .set(set)
      .where('provider', '=', provider)
      .where('provider_id', '=', providerId)
      .executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  /** Sets (or replaces) the AgentStarted tag. `startedAt` defaults to the database's now. */
  async setAgentStarted(machineId: string, agent: { publicKey: Uint8Array; startedAt?: Date }): Promise<void> {
    const startedAt = agent.startedAt ?? sql<Date>`now()`;
    await this.db
      .insertInto('machine_agent_started')
      .values({ machine_id: machineId, agent_started_at: startedAt, agent_public_key: agent.publicKey })
      .onConflict((oc) =>
        oc.column('machine_id').doUpdateSet({ agent_started_at: startedAt, agent_public_key: agent.publicKey }),
      )
      .execute();
  }

  /** Removes the AgentStarted tag, if any. */
  async deleteAgentStarted(machineId: string): Promise<void> {
    await this.db.deleteFrom('machine_agent_started').where('machine_id', '=', machineId).execute();
  }

  /** Records an agent heartbeat at `at` (default, and at most, the database's now). */
  async setAgentHeartbeat(machineId: string, at?: Date): Promise<void> {
    // Never later than the database's now: a writer whose clock runs fast
    // would otherwise keep a silent agent looking alive until its time comes.
    const heartbeatAt = at === undefined ? sql<Date>`now()` : sql<Date>`least(${at}::timestamptz, now())`;
    await this.db
      .insertInto('machine_agent_heartbeat')
      .values({ machine_id: machineId, agent_heartbeat_at: heartbeatAt })
      .onConflict((oc) => oc.column('machine_id').doUpdateSet({ agent_heartbeat_at: heartbeatAt }))
      .execute();
  }

  /** Removes the AgentHeartbeat tag, if any. */
  async deleteAgentHeartbeat(machineId: string): Promise<void> {
    await this.db.deleteFrom('machine_agent_heartbeat').where('machine_id', '=', machineId).execute();
  }

  /** Every machine provided by `provider`, ordered by provider ID. */
  async providedMachines(provider: string): Promise<ProvidedMachine[]> {
    const rows = await this.db
      .selectFrom('machine_provided')
      .selectAll()
      .where('provider', '=', provider)
      .orderBy('provider_id')
      .execute();
    return rows.map(toProvidedMachine);
  }

  /** The Provided tag of one machine, if it has one. */
  async providedMachine(machineId: string): Promise<ProvidedMachine | undefined> {
    const row = await this.db
      .selectFrom('machine_provided')
      .selectAll()
      .where('machine_id', '=', machineId)
      .executeTakeFirst();
    return row && toProvidedMachine(row);
  }

  /**
   * Machines of `provider` whose agent must be started: provided, no
   * AgentStarted tag, no live shepherd work, no running ShepherdAgentStart
   * backoff.
   */
  async machinesForAgentStart(options: { provider: string; limit: number }): Promise<ProvidedMachine[]> {
    const rows = await this.#agentStartQuery(options.provider).limit(options.limit).execute();
    return rows.map(toProvidedMachine);
  }

  /**
   * {@link Queries.machinesForAgentStart} as a {@link Selection}, for
   * one-statement claims (`Session.work`, `ControlLoop.selectMachines`).
   */
  agentStartSelection(options: { provider: string }): Selection<ProvidedMachine, MachineProvidedRow> {
    return {
      process: Process.ShepherdAgentStart,
      query: this.#agentStartQuery(options.provider),
      toCandidate: toProvidedMachine,
    };
  }

  /**
   * Machines of `provider` whose agent went silent: AgentStarted and either no
   * heartbeat `firstHeartbeatWithin` after the start, or a last heartbeat older
   * than `heartbeatWithin`; no live shepherd work, no running
   * ShepherdRecovery backoff.
   */
  async machinesForAgentRecovery(
    options: { provider: string; limit: number } & RecoveryThresholds,
  ): Promise<ProvidedMachine[]> {
    const rows = await this.#agentRecoveryQuery(options).limit(options.limit).execute();
    return rows.map(toProvidedMachine);
  }

  /** {@link Queries.machinesForAgentRecovery} as a {@link Selection}. */
  agentRecoverySelection(
    options: { provider: string } & RecoveryThresholds,
  ): Selection<ProvidedMachine, MachineProvidedRow> {
    return {
      process: Process.ShepherdRecovery,
      query: this.#agentRecoveryQuery(options),
      toCandidate: toProvidedMachine,
    };
  }

  /**
   * The candidates come from `machine_agent_pending` (provided machines
   * without AgentStarted, kept by triggers of migration 0002 in the same
   * transaction as the tags): index range scans, however many machines are
   * started. They are read from a random machine ID onwards, then from the
   * start of the range up to it, so parallel claims start at different
   * machines instead of all walking past the same few being claimed.
   */
  #agentStartQuery(provider: string) {
    const pending = sql<{ machine_id: string }>`(
      WITH start AS (SELECT gen_random_uuid() AS at)
      (SELECT machine_id FROM machine_agent_pending
       WHERE provider = ${provider} AND machine_id >= (SELECT at FROM start) ORDER BY machine_id)
      UNION ALL
      (SELECT machine_id FROM machine_agent_pending
       WHERE provider = ${provider} AND machine_id < (SELECT at FROM start) ORDER BY machine_id))`;
    return this.db
      .selectFrom(pending.as('pending'))
      .innerJoin('machine_provided as mp', 'mp.machine_id', 'pending.machine_id')
      .selectAll('mp')
      .where('mp.provider', '=', provider)
      .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
      .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', 'ShepherdAgentStart')}`);
  }

  /**
   * Lost agents come from two index range scans, one per way of going
   * silent: heartbeats older than the threshold (`machine_agent_heartbeat_at_idx`),
   * and agents without any heartbeat started before it (the partial
   * `machine_agent_started_silent_idx`). Healthy machines are in neither.
   */
  #agentRecoveryQuery(options: { provider: string } & RecoveryThresholds) {
    const firstWithin = seconds(options.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN);
    const within = seconds(options.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN);
    const silent = this.db
      .selectFrom('machine_agent_heartbeat as h')
      .innerJoin('machine_agent_started as a', 'a.machine_id', 'h.machine_id')
      .select('h.machine_id')
      .where(sql<boolean>`h.agent_heartbeat_at < now() - make_interval(secs => ${within})`)
      .unionAll(
        this.db
          .selectFrom('machine_agent_started as a')
          .select('a.machine_id')
          .where('a.has_heartbeat', '=', false)
          .where(sql<boolean>`a.agent_started_at < now() - make_interval(secs => ${firstWithin})`)
          .where(sql<boolean>`NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = a.machine_id)`),
      );
    return this.db
      .selectFrom('machine_provided as mp')
      .selectAll('mp')
      .where('mp.provider', '=', options.provider)
      .where('mp.machine_id', 'in', silent)
      .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
      .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', 'ShepherdRecovery')}`);
  }

  /** A machine's work history, oldest first. */
  async workHistory(machineId: string, options: { process?: string } = {}): Promise<WorkHistoryEntry[]> {
    let query = this.db.selectFrom('work_history').selectAll().where('machine_id', '=', machineId);
    if (options.process !== undefined) query = query.where('process', '=', options.process);
    const rows = await query
      // Events written by one statement share a timestamp; the lifecycle order breaks the tie.
      .orderBy('timestamp')
      .orderBy(sql`array_position(ARRAY['Canceled', 'Started', 'Failed', 'Finished'], event)`)
      .execute();
    return rows.map((row) => ({
      machineId: row.machine_id,
      process: row.process,
      event: row.event,
      timestamp: row.timestamp,
      failedCause: row.failed_cause,
    }));
  }

  /** A machine's backoffs (running or not), by process. */
  async workBackoffs(machineId: string): Promise<WorkBackoffEntry[]> {
    const rows = await this.db
      .selectFrom('work_backoff')
      .selectAll()
      .select(sql<boolean>`until > now()`.as('active'))
      .where('machine_id', '=', machineId)
      .orderBy('process')
      .execute();
    return rows.map(toBackoffEntry);
  }

  /** Running backoffs across the fleet, soonest to end first. */
  async activeBackoffs(options: { process?: string; limit?: number } = {}): Promise<WorkBackoffEntry[]> {
    let query = this.db
      .selectFrom('work_backoff')
      .selectAll()
      .select(sql<boolean>`true`.as('active'))
      .where(sql<boolean>`until > now()`);
    if (options.process !== undefined) query = query.where('process', '=', options.process);
    const rows = await query
      .orderBy('until')
      .limit(options.limit ?? 100)
      .execute();
    return rows.map(toBackoffEntry);
  }

  /**
   * Machines per lifecycle stage, live work and running backoffs per process.
   * A full scan: meant for status pages, not for control loops.
   */
  async fleetStats(options: { provider?: string } & RecoveryThresholds = {}): Promise<FleetStats> {
    const provider = options.provider;
    const stageRow = await this.db
      .selectFrom('machines as m')
      .leftJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
      .leftJoin('machine_agent_started as a', 'a.machine_id', 'm.machine_id')
      .leftJoin('machine_agent_heartbeat as h', 'h.machine_id', 'm.machine_id')
      .$if(provider !== undefined, (qb) => qb.where('mp.provider', '=', provider as string))
      .select([
        sql<number>`count(*)::int`.as('machines'),
        sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NULL))::int`.as('unprovided'),
        sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NOT NULL AND a.machine_id IS NULL
          AND NOT ${hasLiveWork('m.machine_id', ['ShepherdAgentStart'])}))::int`.as('provided'),
        sql<number>`(count(*) FILTER (WHERE mp.machine_id IS NOT NULL AND a.machine_id IS NULL
          AND ${hasLiveWork('m.machine_id', ['ShepherdAgentStart'])}))::int`.as('agent_starting'),
        sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND h.machine_id IS NULL
          AND NOT ${lostAgent(options)}))::int`.as('agent_started'),
        sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND h.machine_id IS NOT NULL
          AND NOT ${lostAgent(options)}))::int`.as('heartbeating'),
        sql<number>`(count(*) FILTER (WHERE a.machine_id IS NOT NULL AND ${lostAgent(options)}))::int`.as(
          'awaiting_recovery',
        ),
      ])
      .executeTakeFirstOrThrow();

    const work = await this.db
      .selectFrom('work as w')
      .innerJoin('sessions as s', 's.session_id', 'w.session_id')
      .select(['w.process', sql<number>`count(*)::int`.as('count')])
      .where(sql<boolean>`s.deadline > now()`)
      .groupBy('w.process')
      .orderBy('w.process')
      .execute();
    const backoffs = await this.db
      .selectFrom('work_backoff')
      .select(['process', sql<number>`count(*)::int`.as('count')])
      .where(sql<boolean>`until > now()`)
      .groupBy('process')
      .orderBy('process')
      .execute();

    return {
      machines: stageRow.machines,
      stages: {
        unprovided: stageRow.unprovided,
        provided: stageRow.provided,
        agentStarting: stageRow.agent_starting,
        agentStarted: stageRow.agent_started,
        heartbeating: stageRow.heartbeating,
        awaitingRecovery: stageRow.awaiting_recovery,
      },
      activeWork: Object.fromEntries(work.map((row) => [row.process, row.count])),
      activeBackoffs: Object.fromEntries(backoffs.map((row) => [row.process, row.count])),
    };
  }
}

/** The recovery predicate over aliases `a` (AgentStarted) and `h` (AgentHeartbeat). */
function lostAgent(thresholds: RecoveryThresholds): RawBuilder<boolean> {
  const firstWithin = seconds(thresholds.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN);
  const within = seconds(thresholds.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN);
  return sql<boolean>`(
    (h.machine_id IS NULL AND a.agent_started_at < now() - make_interval(secs => ${firstWithin}))
    OR (h.machine_id IS NOT NULL AND h.agent_heartbeat_at < now() - make_interval(secs => ${within})))`;
}

function seconds(ms: number): number {
  if (!(ms >= 0) || !Number.isFinite(ms))
    throw new RangeError(`recovery threshold must be a duration >= 0, got ${ms}ms`);
  return ms / 1000;
}

function toProvidedMachine(row: MachineProvidedRow): ProvidedMachine {
  return {
    machineId: row.machine_id,
    provider: row.provider,
    providerId: row.provider_id,
    providerReservationId: row.provider_reservation_id,
    providerIpAddress: row.provider_ip_address,
    providerLocation: row.provider_location,
    providerStatus: row.provider_status,
  };
}

function toBackoffEntry(row: {
  machine_id: string;
  process: string;
  until: Date;
  cause: string;
  last_interval_seconds: number | null;
  active: boolean;
}): WorkBackoffEntry {
  return {
    machineId: row.machine_id,
    process: row.process,
    until: row.until,
    cause: row.cause,
    lastIntervalSeconds: row.last_interval_seconds,
    active: row.active,
  };
}
