import { type Kysely, type RawBuilder, sql } from 'kysely';
import type { HardwareReportEntry, OSInstallationReportEntry } from './agent-heartbeat.js';
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

/** A running backoff with the machine's provider, as a status report lists it. */
export interface ActiveBackoff extends WorkBackoffEntry {
  /** The machine's provider and provider ID; null when it has no Provided tag. */
  readonly provider: string | null;
  readonly providerId: string | null;
  /** Whole seconds until `until`, rounded up, by the database's clock. */
  readonly secondsLeft: number;
}

/** An agent heartbeat dated ahead of the database's clock (see {@link Queries.agentHeartbeatsAhead}). */
export interface HeartbeatAhead {
  readonly machineId: string;
  readonly providerId: string;
  readonly heartbeatAt: Date;
}

/** A machine with a started agent (the AgentStarted tag). */
export interface StartedAgent {
  readonly machineId: string;
  readonly startedAt: Date;
}

/** What {@link Queries.decommissionMachines} did with each provider ID it was given. */
export interface DecommissionReport {
  /** Removed from the BMDB, with their tags and backoffs; their work history stays. */
  readonly removed: readonly { readonly providerId: string; readonly machineId: string }[];
  /** Refused: work of these processes is held on them by a live session. */
  readonly busy: readonly {
    readonly providerId: string;
    readonly machineId: string;
    readonly processes: readonly string[];
  }[];
  /** Not in the BMDB under this provider. */
  readonly unknown: readonly string[];
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
/** Heartbeats written per statement by {@link Queries.setAgentHeartbeats}. */
const HEARTBEATS_PER_STATEMENT = 10_000;
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

  /**
   * Records a heartbeat at the database's now for each of `machineIds`, a
   * few statements for any number (two parameters a machine, well under
   * PostgreSQL's 65535 per statement).
   */
  async setAgentHeartbeats(machineIds: readonly string[]): Promise<void> {
    for (let i = 0; i < machineIds.length; i += HEARTBEATS_PER_STATEMENT) {
      await this.db
        .insertInto('machine_agent_heartbeat')
        .values(
          machineIds
            .slice(i, i + HEARTBEATS_PER_STATEMENT)
            .map((machineId) => ({ machine_id: machineId, agent_heartbeat_at: sql<Date>`now()` })),
        )
        .onConflict((oc) => oc.column('machine_id').doUpdateSet({ agent_heartbeat_at: sql<Date>`now()` }))
        .execute();
    }
  }

  /** The machines of `provider` whose agent was started (AgentStarted), and when. */
  async startedAgents(provider: string): Promise<StartedAgent[]> {
    const rows = await this.db
      .selectFrom('machine_agent_started as a')
      .innerJoin('machine_provided as p', 'p.machine_id', 'a.machine_id')
      .where('p.provider', '=', provider)
      .select(['a.machine_id', 'a.agent_started_at'])
      .execute();
    return rows.map((row) => ({ machineId: row.machine_id, startedAt: row.agent_started_at }));
  }

  /**
   * The heartbeats of `provider`'s machines dated more than `toleranceSeconds`
   * after the database's now, and that now: an index range scan
   * (`machine_agent_heartbeat_at_idx`).
   */
  async agentHeartbeatsAhead(options: {
    provider: string;
    toleranceSeconds: number;
  }): Promise<{ now: Date; heartbeats: HeartbeatAhead[] }> {
    // The database's clock, not ours: it is the one the recovery selection compares with.
    const now = await this.now();
    const rows = await this.db
      .selectFrom('machine_agent_heartbeat as h')
      .innerJoin('machine_provided as p', 'p.machine_id', 'h.machine_id')
      .select(['h.machine_id', 'p.provider_id', 'h.agent_heartbeat_at'])
      .where('p.provider', '=', options.provider)
      .where('h.agent_heartbeat_at', '>', new Date(now.getTime() + options.toleranceSeconds * 1000))
      .execute();
    return {
      now,
      heartbeats: rows.map((row) => ({
        machineId: row.machine_id,
        providerId: row.provider_id,
        heartbeatAt: row.agent_heartbeat_at,
      })),
    };
  }

  /** The machine's last hardware report from its agent, if any. */
  async hardwareReport(machineId: string): Promise<HardwareReportEntry | undefined> {
    const row = await this.db
      .selectFrom('machine_hardware_report')
      .selectAll()
      .where('machine_id', '=', machineId)
      .executeTakeFirst();
    return row && { machineId: row.machine_id, raw: row.hardware_report_raw, reportedAt: row.hardware_reported_at };
  }

  /** The machine's last OS installation report from its agent, if any. */
  async osInstallationReport(machineId: string): Promise<OSInstallationReportEntry | undefined> {
    const row = await this.db
      .selectFrom('machine_os_installation_report')
      .selectAll()
      .where('machine_id', '=', machineId)
      .executeTakeFirst();
    return (
      row && {
        machineId: row.machine_id,
        generation: BigInt(row.generation),
        result: row.os_installation_result,
        raw: row.os_installation_report_raw,
        reportedAt: row.os_installation_reported_at,
      }
    );
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

  /**
   * Removes the machines `providerIds` of `provider` from the BMDB: the
   * machine rows and, by cascade, their tags and backoffs. Machines with
   * work held by a live session (any process) are refused and left as they
   * are; work left behind by expired sessions goes with its machine. Work
   * history has no key on machines and stays, for the record.
   *
   * The machines are locked first (`FOR UPDATE`), so a claim racing with the
   * removal either lands first and is seen, or waits and then fails.
   */
  async decommissionMachines(provider: string, providerIds: readonly string[]): Promise<DecommissionReport> {
    const wanted = [...new Set(providerIds)];
    if (wanted.length === 0) return { removed: [], busy: [], unknown: [] };
    const rows = await this.db
      .selectFrom('machines as m')
      .innerJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
      .select([
        'm.machine_id',
        'mp.provider_id',
        sql<string[]>`ARRAY(
          SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
          WHERE w.machine_id = m.machine_id AND s.deadline > now() ORDER BY w.process)`.as('live'),
      ])
      .where('mp.provider', '=', provider)
      .where('mp.provider_id', 'in', wanted)
      .orderBy('mp.provider_id')
      .forUpdate('m')
      .execute();
    const removed = rows.filter((row) => row.live.length === 0);
    const ids = removed.map((row) => row.machine_id);
    if (ids.length > 0) {
      // Only dead work is left on them: its key on machines would block the delete.
      await this.db.deleteFrom('work').where('machine_id', 'in', ids).execute();
      await this.db.deleteFrom('machines').where('machine_id', 'in', ids).execute();
    }
    const found = new Set(rows.map((row) => row.provider_id));
    return {
      removed: removed.map((row) => ({ providerId: row.provider_id, machineId: row.machine_id })),
      busy: rows
        .filter((row) => row.live.length > 0)
        .map((row) => ({ providerId: row.provider_id, machineId: row.machine_id, processes: row.live })),
      unknown: wanted.filter((id) => !found.has(id)).sort(),
    };
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

  /**
   * Running backoffs across the fleet, soonest to end first, with each
   * machine's provider ID and the seconds left.
   */
  async activeBackoffs(options: { process?: string; limit?: number } = {}): Promise<ActiveBackoff[]> {
    let query = this.db
      .selectFrom('work_backoff as b')
      .leftJoin('machine_provided as p', 'p.machine_id', 'b.machine_id')
      .selectAll('b')
      .select([
        'p.provider',
        'p.provider_id',
        sql<boolean>`true`.as('active'),
        sql<number>`ceil(extract(epoch FROM b.until - now()))::int`.as('seconds_left'),
      ])
      .where(sql<boolean>`b.until > now()`);
    if (options.process !== undefined) query = query.where('b.process', '=', options.process);
    const rows = await query
      .orderBy('b.until')
      .limit(options.limit ?? 100)
      .execute();
    return rows.map((row) => ({
      ...toBackoffEntry(row),
      provider: row.provider,
      providerId: row.provider_id,
      secondsLeft: row.seconds_left,
    }));
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

    const activeWork = await this.liveWorkByProcess();
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
      activeWork,
      activeBackoffs: Object.fromEntries(backoffs.map((row) => [row.process, row.count])),
    };
  }

  /** The database's clock: what ages and "time left" on status pages are measured from. */
  async now(): Promise<Date> {
    const row = await this.db.selectNoFrom(sql<Date>`now()`.as('now')).executeTakeFirstOrThrow();
    return row.now;
  }

  /**
   * Machines per lifecycle stage, like {@link Queries.fleetStats}' `stages`,
   * from index-only counts instead of a scan joining every machine's tags:
   * fast enough for a page refreshed every few seconds at 100,000 machines.
   * A machine without a Provided tag counts as `unprovided` whatever its
   * other tags.
   */
  async fleetStages(thresholds: RecoveryThresholds = {}): Promise<{ machines: number; stages: FleetStages }> {
    const firstWithin = seconds(thresholds.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN);
    const within = seconds(thresholds.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN);
    // Machines are unprovided or provided (machine_unprovided is kept by
    // triggers), provided ones pending (no AgentStarted; machine_agent_pending
    // likewise) or started: one count of every machine, the rest read from
    // the small sets of unprovided, pending, silent, stale and starting ones.
    const { rows } = await sql<{
      machines: number;
      unprovided: number;
      pending: number;
      starting: number;
      silent: number;
      silent_lost: number;
      stale: number;
    }>`SELECT
        (SELECT count(*)::int FROM machines) AS machines,
        (SELECT count(*)::int FROM machine_unprovided) AS unprovided,
        (SELECT count(*)::int FROM machine_agent_pending) AS pending,
        (SELECT count(*)::int FROM work w JOIN sessions s ON s.session_id = w.session_id
          WHERE w.process = 'ShepherdAgentStart' AND s.deadline > now()
            AND EXISTS (SELECT 1 FROM machine_agent_pending p WHERE p.machine_id = w.machine_id)) AS starting,
        (SELECT count(*)::int FROM machine_agent_started a WHERE NOT a.has_heartbeat
            AND EXISTS (SELECT 1 FROM machine_provided mp WHERE mp.machine_id = a.machine_id)) AS silent,
        (SELECT count(*)::int FROM machine_agent_started a WHERE NOT a.has_heartbeat
            AND a.agent_started_at < now() - make_interval(secs => ${firstWithin})
            AND EXISTS (SELECT 1 FROM machine_provided mp WHERE mp.machine_id = a.machine_id)) AS silent_lost,
        (SELECT count(*)::int FROM machine_agent_heartbeat h
          WHERE h.agent_heartbeat_at < now() - make_interval(secs => ${within})
            AND EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = h.machine_id)
            AND EXISTS (SELECT 1 FROM machine_provided mp WHERE mp.machine_id = h.machine_id)) AS stale`.execute(
      this.db,
    );
    const row = rows[0];
    if (row === undefined) throw new Error('fleetStages: the count query returned no row');
    const started = row.machines - row.unprovided - row.pending;
    return {
      machines: row.machines,
      stages: {
        unprovided: row.unprovided,
        provided: row.pending - row.starting,
        agentStarting: row.starting,
        agentStarted: row.silent - row.silent_lost,
        heartbeating: started - row.silent - row.stale,
        awaitingRecovery: row.silent_lost + row.stale,
      },
    };
  }

  /**
   * The providers machines are provided by, sorted. One index probe per
   * provider (a loose index scan), not a scan of every machine.
   */
  async providers(): Promise<string[]> {
    const { rows } = await sql<{ provider: string }>`
      WITH RECURSIVE p AS (
        (SELECT provider FROM machine_provided ORDER BY provider LIMIT 1)
        UNION ALL
        SELECT (SELECT mp.provider FROM machine_provided mp WHERE mp.provider > p.provider
                ORDER BY mp.provider LIMIT 1)
        FROM p WHERE p.provider IS NOT NULL)
      SELECT provider FROM p WHERE provider IS NOT NULL`.execute(this.db);
    return rows.map((row) => row.provider);
  }

  /** How many machines each provider has in the BMDB, by provider name. */
  async machinesPerProvider(): Promise<Record<string, number>> {
    const rows = await this.db
      .selectFrom('machine_provided')
      .select(['provider', sql<number>`count(*)::int`.as('machines')])
      .groupBy('provider')
      .orderBy('provider')
      .execute();
    return Object.fromEntries(rows.map((row) => [row.provider, row.machines]));
  }

  /** Live work items (held by unexpired sessions), per process. */
  async liveWorkByProcess(): Promise<Record<string, number>> {
    const rows = await this.db
      .selectFrom('work as w')
      .innerJoin('sessions as s', 's.session_id', 'w.session_id')
      .select(['w.process', sql<number>`count(*)::int`.as('count')])
      .where(sql<boolean>`s.deadline > now()`)
      .groupBy('w.process')
      .orderBy('w.process')
      .execute();
    return Object.fromEntries(rows.map((row) => [row.process, row.count]));
  }

  /** Sessions whose deadline has not passed (which processes are alive), oldest first, with their live work. */
  async liveSessions(): Promise<LiveSession[]> {
    const rows = await this.db
      .selectFrom('sessions as s')
      .select([
        's.session_id',
        's.component_name',
        's.runtime_info',
        's.processor',
        's.created_at',
        's.interval_seconds',
        's.deadline',
        sql<number>`(SELECT count(*)::int FROM work w WHERE w.session_id = s.session_id)`.as('work'),
      ])
      .where(sql<boolean>`s.deadline > now()`)
      .orderBy('s.created_at')
      .orderBy('s.session_id')
      .execute();
    return rows.map((row) => ({
      sessionId: row.session_id,
      componentName: row.component_name,
      runtimeInfo: row.runtime_info,
      processor: row.processor,
      createdAt: row.created_at,
      intervalSeconds: row.interval_seconds,
      deadline: row.deadline,
      work: row.work,
    }));
  }

  /**
   * Running backoffs grouped by process and cause, the most machines first:
   * how many machines fail for the same reason. Causes often name their
   * machine; UUIDs and IPv4 addresses (with a port) in them are replaced by
   * `<id>` and `<address>` first, so one failure on many machines is one
   * group.
   */
  async backoffCauses(options: { limit?: number } = {}): Promise<BackoffCause[]> {
    const { rows } = await sql<{
      process: string;
      cause: string;
      machines: number;
      soonest_until: Date;
      latest_until: Date;
      example_machine_id: string;
      example_cause: string;
    }>`
      SELECT process, cause, count(*)::int AS machines, min(until) AS soonest_until, max(until) AS latest_until,
             (array_agg(machine_id ORDER BY until DESC))[1] AS example_machine_id,
             (array_agg(original ORDER BY until DESC))[1] AS example_cause
      FROM (
        SELECT process, machine_id, until, cause AS original,
               regexp_replace(
                 regexp_replace(cause, ${CAUSE_UUID}, '<id>', 'g'),
                 ${CAUSE_ADDRESS}, '<address>', 'g') AS cause
        FROM work_backoff WHERE until > now()) AS running
      GROUP BY process, cause
      ORDER BY machines DESC, process, cause
      LIMIT ${options.limit ?? 20}`.execute(this.db);
    return rows.map((row) => ({
      process: row.process,
      cause: row.cause,
      machines: row.machines,
      soonestUntil: row.soonest_until,
      latestUntil: row.latest_until,
      exampleMachineId: row.example_machine_id,
      exampleCause: row.example_cause,
    }));
  }

  /** The fleet's latest `Failed` history events, newest first (index `work_history_failed_idx`). */
  async recentFailures(options: { limit?: number } = {}): Promise<RecentFailure[]> {
    const rows = await this.db
      .selectFrom('work_history as wh')
      .leftJoin('machine_provided as mp', 'mp.machine_id', 'wh.machine_id')
      .select(['wh.machine_id', 'wh.process', 'wh.timestamp', 'wh.failed_cause', 'mp.provider', 'mp.provider_id'])
      .where('wh.event', '=', 'Failed')
      .orderBy('wh.timestamp', 'desc')
      .limit(options.limit ?? 20)
      .execute();
    return rows.map((row) => ({
      machineId: row.machine_id,
      process: row.process,
      timestamp: row.timestamp,
      cause: row.failed_cause,
      provider: row.provider,
      providerId: row.provider_id,
    }));
  }

  /**
   * The machine a person means by `id`: a machine ID, or a provider ID known
   * to exactly one provider. `undefined` when none or several match.
   */
  async findMachine(id: string): Promise<string | undefined> {
    const trimmed = id.trim();
    if (UUID.test(trimmed)) {
      const row = await this.db
        .selectFrom('machines')
        .select('machine_id')
        .where('machine_id', '=', trimmed.toLowerCase())
        .executeTakeFirst();
      if (row) return row.machine_id;
    }
    const rows = await this.db
      .selectFrom('machine_provided')
      .select('machine_id')
      .where('provider_id', '=', trimmed)
      .limit(2)
      .execute();
    return rows.length === 1 ? rows[0]?.machine_id : undefined;
  }

  /**
   * One page of machines matching `filter`, in machine ID order, from
   * `filter.after` (keyset pagination: pass the page's `next` to get the
   * next). Each filter is served by an index: the most selective one given
   * chooses the rows read, the others are checked on them.
   */
  async machinePage(filter: MachineFilter = {}, thresholds: RecoveryThresholds = {}): Promise<MachinePage> {
    const limit = filter.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000)
      throw new RangeError(`machinePage: limit must be a whole number from 1 to 1000, got ${limit}`);
    if (filter.after !== undefined && !UUID.test(filter.after))
      throw new RangeError(`machinePage: after must be a machine ID (a UUID), got ${JSON.stringify(filter.after)}`);
    const search = filter.search?.trim() || undefined;
    // The page's IDs first, from the rows of the index serving the filter that
    // chooses them, every other filter checked per ID by key: the planner can
    // stop after `limit + 1` matches in ID order, and the columns are then
    // read for those IDs only. DISTINCT: a machine may come from two rows
    // (backoffs of two processes, a search matching both IDs).
    const conditions: RawBuilder<boolean>[] = [];
    if (filter.after !== undefined) conditions.push(sql<boolean>`ids.machine_id > ${filter.after}::uuid`);
    if (filter.provider !== undefined) {
      conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM machine_provided fp
        WHERE fp.machine_id = ids.machine_id AND fp.provider = ${filter.provider})`);
    }
    if (filter.liveWork !== undefined) conditions.push(hasLiveWork('ids.machine_id', [filter.liveWork]));
    if (filter.inBackoff !== undefined) {
      conditions.push(sql<boolean>`EXISTS (SELECT 1 FROM work_backoff fb WHERE fb.machine_id = ids.machine_id
        AND fb.until > now() ${filter.inBackoff === true ? sql`` : sql`AND fb.process = ${filter.inBackoff}`})`);
    }
    if (search !== undefined && filter.stage !== undefined) conditions.push(searchCondition(search));
    const { rows } = await sql<MachineSummaryRow>`
      SELECT ${machineColumns(thresholds)}
      FROM (
        SELECT DISTINCT ids.machine_id FROM ${drivingIds(filter, search, thresholds)} AS ids
        WHERE ${conditions.length === 0 ? sql`true` : sql.join(conditions, sql` AND `)}
        ORDER BY ids.machine_id
        LIMIT ${limit + 1}) AS page
      JOIN machines m ON m.machine_id = page.machine_id
      LEFT JOIN machine_provided mp ON mp.machine_id = m.machine_id
      LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
      LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
      ORDER BY m.machine_id`.execute(this.db);
    const machines = rows.slice(0, limit).map(toMachineSummary);
    return { machines, next: rows.length > limit ? machines.at(-1)?.machineId : undefined };
  }

  /**
   * Everything known about one machine: its tags and stage, live work, every
   * backoff (running or expired) and its work history, newest first, up to
   * `historyLimit` entries (default 500; `historyTotal` says how many exist).
   */
  async machineDetail(
    machineId: string,
    options: { historyLimit?: number } & RecoveryThresholds = {},
  ): Promise<MachineDetail | undefined> {
    if (!UUID.test(machineId)) return undefined;
    const { rows } = await sql<MachineSummaryRow & { agent_public_key: Uint8Array | null }>`
      SELECT ${machineColumns(options)}, a.agent_public_key
      FROM machines m
      LEFT JOIN machine_provided mp ON mp.machine_id = m.machine_id
      LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
      LEFT JOIN machine_agent_heartbeat h ON h.machine_id = m.machine_id
      WHERE m.machine_id = ${machineId}::uuid`.execute(this.db);
    const row = rows[0];
    if (row === undefined) return undefined;
    const work = await this.db
      .selectFrom('work as w')
      .innerJoin('sessions as s', 's.session_id', 'w.session_id')
      .select([
        'w.process',
        'w.session_id',
        's.processor',
        's.component_name',
        's.deadline',
        sql<Date | null>`(SELECT max(wh."timestamp") FROM work_history wh
          WHERE wh.machine_id = w.machine_id AND wh.process = w.process AND wh.event = 'Started')`.as('since'),
      ])
      .where('w.machine_id', '=', machineId)
      .where(sql<boolean>`s.deadline > now()`)
      .orderBy('w.process')
      .execute();
    const historyLimit = options.historyLimit ?? 500;
    const history = await this.db
      .selectFrom('work_history')
      .selectAll()
      .where('machine_id', '=', machineId)
      .orderBy('timestamp', 'desc')
      .orderBy(sql`array_position(ARRAY['Canceled', 'Started', 'Failed', 'Finished'], event)`, 'desc')
      .limit(historyLimit)
      .execute();
    const total = await this.db
      .selectFrom('work_history')
      .select(sql<number>`count(*)::int`.as('count'))
      .where('machine_id', '=', machineId)
      .executeTakeFirstOrThrow();
    return {
      ...toMachineSummary(row),
      agentPublicKey: row.agent_public_key,
      liveWork: work.map((w) => ({
        process: w.process,
        sessionId: w.session_id,
        processor: w.processor,
        componentName: w.component_name,
        sessionDeadline: w.deadline,
        since: w.since,
      })),
      backoffs: await this.workBackoffs(machineId),
      history: history.map((h) => ({
        machineId: h.machine_id,
        process: h.process,
        event: h.event,
        timestamp: h.timestamp,
        failedCause: h.failed_cause,
      })),
      historyTotal: total.count,
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

/** Where a machine stands in its life: a key of {@link FleetStages}. Each machine is in exactly one. */
export type MachineStage = keyof FleetStages;

/** Every stage, in lifecycle order. */
export const MACHINE_STAGES: readonly MachineStage[] = [
  'unprovided',
  'provided',
  'agentStarting',
  'agentStarted',
  'heartbeating',
  'awaitingRecovery',
];

/** A session whose deadline has not passed: a live process using the BMDB. */
export interface LiveSession {
  readonly sessionId: string;
  readonly componentName: string;
  readonly runtimeInfo: string;
  /** The loop holding it (`shepherd-initializer`); null for sessions from before migration 0004. */
  readonly processor: string | null;
  readonly createdAt: Date;
  readonly intervalSeconds: number;
  readonly deadline: Date;
  /** Work items it holds. */
  readonly work: number;
}

/** Machine IDs and IPv4 addresses in failure causes, replaced to group causes (PostgreSQL regular expressions). */
const CAUSE_UUID = '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}';
const CAUSE_ADDRESS = '\\m[0-9]{1,3}(\\.[0-9]{1,3}){3}(:[0-9]{1,5})?\\M';

/** Machines backing off for one process with the same cause (IDs and addresses aside). */
export interface BackoffCause {
  readonly process: string;
  readonly cause: string;
  readonly machines: number;
  readonly soonestUntil: Date;
  readonly latestUntil: Date;
  /** The machine whose backoff runs longest, as an example to look at. */
  readonly exampleMachineId: string;
  /** Its cause as recorded, with its IDs and addresses. */
  readonly exampleCause: string;
}

/** A `Failed` history event with the machine's provider ID. */
export interface RecentFailure {
  readonly machineId: string;
  readonly process: string;
  readonly timestamp: Date;
  readonly cause: string | null;
  readonly provider: string | null;
  readonly providerId: string | null;
}

/** What {@link Queries.machinePage} lists. Every field given must hold. */
export interface MachineFilter {
  readonly stage?: MachineStage;
  readonly provider?: string;
  /** Machines with live work of this process. */
  readonly liveWork?: string;
  /** Machines with a running backoff: of any process (`true`) or of this one. */
  readonly inBackoff?: true | string;
  /** A machine ID or provider ID, or the start of one. */
  readonly search?: string;
  /** Machines after this machine ID (the previous page's `next`). */
  readonly after?: string;
  /** Machines per page, 1 to 1000. Default 50. */
  readonly limit?: number;
}

/** A machine as a fleet table shows it. */
export interface MachineSummary {
  readonly machineId: string;
  readonly createdAt: Date;
  readonly stage: MachineStage;
  /** The Provided tag, if any. */
  readonly provided: ProvidedMachine | undefined;
  readonly agentStartedAt: Date | null;
  readonly lastHeartbeatAt: Date | null;
  /** Processes with live work on the machine. */
  readonly liveWork: readonly string[];
  /** Processes with a running backoff on the machine. */
  readonly backoffs: readonly string[];
  /** The cause of the running backoff that lasts longest, if any. */
  readonly backoffCause: string | null;
}

/** One page of {@link Queries.machinePage}. */
export interface MachinePage {
  readonly machines: readonly MachineSummary[];
  /** Pass as `after` for the next page; `undefined` on the last. */
  readonly next: string | undefined;
}

/** Live work on a machine and who holds it. */
export interface LiveWorkItem {
  readonly process: string;
  readonly sessionId: string;
  readonly processor: string | null;
  readonly componentName: string;
  readonly sessionDeadline: Date;
  /** When the work started (its latest `Started` event), if recorded. */
  readonly since: Date | null;
}

/** One machine's whole story (see {@link Queries.machineDetail}). */
export interface MachineDetail extends Omit<MachineSummary, 'liveWork' | 'backoffs'> {
  /** The agent's public key (AgentStarted tag), if started. */
  readonly agentPublicKey: Uint8Array | null;
  readonly liveWork: readonly LiveWorkItem[];
  /** Every backoff of the machine, running (`active`) or expired, by process. */
  readonly backoffs: readonly WorkBackoffEntry[];
  /** The newest history entries, newest first. */
  readonly history: readonly WorkHistoryEntry[];
  /** How many history entries the machine has in all. */
  readonly historyTotal: number;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A machine's stage, over aliases `m`, `mp`, `a` and `h`; the order of {@link FleetStages}' definitions. */
function stageOf(thresholds: RecoveryThresholds): RawBuilder<MachineStage> {
  return sql<MachineStage>`CASE
    WHEN mp.machine_id IS NULL THEN 'unprovided'
    WHEN a.machine_id IS NULL THEN
      CASE WHEN ${hasLiveWork('m.machine_id', ['ShepherdAgentStart'])} THEN 'agentStarting' ELSE 'provided' END
    WHEN ${lostAgent(thresholds)} THEN 'awaitingRecovery'
    WHEN h.machine_id IS NULL THEN 'agentStarted'
    ELSE 'heartbeating' END`;
}

interface MachineSummaryRow {
  machine_id: string;
  machine_created_at: Date;
  provider: string | null;
  provider_id: string | null;
  provider_reservation_id: string | null;
  provider_ip_address: string | null;
  provider_location: string | null;
  provider_status: ProviderStatus | null;
  agent_started_at: Date | null;
  agent_heartbeat_at: Date | null;
  stage: MachineStage;
  live_work: string[];
  backoffs: string[];
  backoff_cause: string | null;
}

/** The columns of {@link MachineSummaryRow}, over aliases `m`, `mp`, `a` and `h`; each subquery reads one machine's rows. */
function machineColumns(thresholds: RecoveryThresholds): RawBuilder<unknown> {
  return sql`m.machine_id, m.machine_created_at, mp.provider, mp.provider_id, mp.provider_reservation_id,
    mp.provider_ip_address, mp.provider_location, mp.provider_status, a.agent_started_at, h.agent_heartbeat_at,
    ${stageOf(thresholds)} AS stage,
    ARRAY(SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
      WHERE w.machine_id = m.machine_id AND s.deadline > now() ORDER BY w.process) AS live_work,
    ARRAY(SELECT b.process FROM work_backoff b
      WHERE b.machine_id = m.machine_id AND b.until > now() ORDER BY b.process) AS backoffs,
    (SELECT b.cause FROM work_backoff b
      WHERE b.machine_id = m.machine_id AND b.until > now() ORDER BY b.until DESC LIMIT 1) AS backoff_cause`;
}

function toMachineSummary(row: MachineSummaryRow): MachineSummary {
  return {
    machineId: row.machine_id,
    createdAt: row.machine_created_at,
    stage: row.stage,
    provided:
      row.provider === null || row.provider_id === null
        ? undefined
        : {
            machineId: row.machine_id,
            provider: row.provider,
            providerId: row.provider_id,
            providerReservationId: row.provider_reservation_id,
            providerIpAddress: row.provider_ip_address,
            providerLocation: row.provider_location,
            providerStatus: row.provider_status,
          },
    agentStartedAt: row.agent_started_at,
    lastHeartbeatAt: row.agent_heartbeat_at,
    liveWork: row.live_work,
    backoffs: row.backoffs,
    backoffCause: row.backoff_cause,
  };
}

/** A search term as a machine ID range (when it can start one) and a provider ID prefix. */
function searchTerms(search: string): { idRange: [string, string] | undefined; providerIdPattern: string } {
  const hex = search.toLowerCase().replaceAll('-', '');
  const idRange =
    /^[0-9a-f]{1,32}$/.test(hex) && /^[0-9a-f-]+$/i.test(search)
      ? ([asUuid(hex.padEnd(32, '0')), asUuid(hex.padEnd(32, 'f'))] as [string, string])
      : undefined;
  return { idRange, providerIdPattern: `${search.replace(/[\\%_]/g, (c) => `\\${c}`)}%` };
}

function asUuid(hex: string): string {
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function searchCondition(search: string): RawBuilder<boolean> {
  const { idRange, providerIdPattern } = searchTerms(search);
  const byProviderId = sql<boolean>`EXISTS (SELECT 1 FROM machine_provided sp
    WHERE sp.machine_id = ids.machine_id AND sp.provider_id LIKE ${providerIdPattern})`;
  if (idRange === undefined) return byProviderId;
  return sql<boolean>`(ids.machine_id BETWEEN ${idRange[0]}::uuid AND ${idRange[1]}::uuid OR ${byProviderId})`;
}

/**
 * The machine IDs a page is read from (a subquery with column `machine_id`):
 * exactly the machines of the filter's stage, from the rows that hold them;
 * else the matches of the search; else the rows of the index serving the most
 * selective other filter. machinePage checks the other filters on them.
 */
function drivingIds(
  filter: MachineFilter,
  search: string | undefined,
  thresholds: RecoveryThresholds,
): RawBuilder<unknown> {
  const firstWithin = seconds(thresholds.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN);
  const within = seconds(thresholds.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN);
  const provided = (id: string) =>
    sql<boolean>`EXISTS (SELECT 1 FROM machine_provided dp WHERE dp.machine_id = ${sql.ref(id)})`;
  const liveWorkOf = (process: string) => sql`(SELECT w.machine_id FROM work w
    JOIN sessions s ON s.session_id = w.session_id
    WHERE w.process = ${process} AND s.deadline > now())`;
  // The stages' definitions, as stageOf() and fleetStages() have them.
  switch (filter.stage) {
    case 'unprovided':
      return sql`(SELECT x.machine_id FROM machine_unprovided x)`;
    case 'provided':
      return sql`(SELECT x.machine_id FROM machine_agent_pending x
        WHERE NOT ${hasLiveWork('x.machine_id', ['ShepherdAgentStart'])})`;
    case 'agentStarting':
      return sql`(SELECT w.machine_id FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.process = 'ShepherdAgentStart' AND s.deadline > now()
          AND EXISTS (SELECT 1 FROM machine_agent_pending p WHERE p.machine_id = w.machine_id))`;
    case 'agentStarted':
      return sql`(SELECT x.machine_id FROM machine_agent_started x
        WHERE NOT x.has_heartbeat AND x.agent_started_at >= now() - make_interval(secs => ${firstWithin})
          AND ${provided('x.machine_id')})`;
    case 'heartbeating':
      return sql`(SELECT x.machine_id FROM machine_agent_heartbeat x
        WHERE x.agent_heartbeat_at >= now() - make_interval(secs => ${within})
          AND EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = x.machine_id)
          AND ${provided('x.machine_id')})`;
    case 'awaitingRecovery':
      return sql`(SELECT x.machine_id FROM machine_agent_heartbeat x
          WHERE x.agent_heartbeat_at < now() - make_interval(secs => ${within})
            AND EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = x.machine_id)
            AND ${provided('x.machine_id')}
        UNION ALL
        SELECT x.machine_id FROM machine_agent_started x
          WHERE NOT x.has_heartbeat AND x.agent_started_at < now() - make_interval(secs => ${firstWithin})
            AND ${provided('x.machine_id')})`;
    case undefined:
      break;
  }
  if (search !== undefined) {
    const { idRange, providerIdPattern } = searchTerms(search);
    const byProviderId = sql`SELECT x.machine_id FROM machine_provided x WHERE x.provider_id LIKE ${providerIdPattern}`;
    if (idRange === undefined) return sql`(${byProviderId})`;
    return sql`(SELECT x.machine_id FROM machines x
      WHERE x.machine_id BETWEEN ${idRange[0]}::uuid AND ${idRange[1]}::uuid
      UNION ALL ${byProviderId})`;
  }
  if (filter.liveWork !== undefined) return liveWorkOf(filter.liveWork);
  if (filter.inBackoff === true) return sql`(SELECT DISTINCT x.machine_id FROM work_backoff x WHERE x.until > now())`;
  if (filter.inBackoff !== undefined)
    return sql`(SELECT x.machine_id FROM work_backoff x WHERE x.process = ${filter.inBackoff} AND x.until > now())`;
  if (filter.provider !== undefined)
    return sql`(SELECT x.machine_id FROM machine_provided x WHERE x.provider = ${filter.provider})`;
  return sql`(SELECT x.machine_id FROM machines x)`;
}
