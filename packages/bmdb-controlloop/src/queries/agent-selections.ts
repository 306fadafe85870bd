/** The shepherd's selections: machines whose agent must be started, and those whose agent went silent. */
import { type Kysely, sql } from 'kysely';
import { type Database, type MachineProvidedRow, Process, SHEPHERD_PROCESSES } from '../schema.js';
import { type Selection, selectionFor } from '../selection.js';
import { hasLiveWork, inBackoff, isHeld } from './conditions.js';
import { type ProvidedMachine, toProvidedMachine } from './provided-tags.js';
import { installingRecently, type RecoveryThresholds, thresholdSeconds } from './recovery-thresholds.js';

/**
 * Machines of `provider` whose agent must be started: provided, no
 * AgentStarted tag, no live shepherd work, no running ShepherdAgentStart
 * backoff, not held.
 */
export async function machinesForAgentStart(
  db: Kysely<Database>,
  options: { provider: string; limit: number },
): Promise<ProvidedMachine[]> {
  const rows = await agentStartQuery(db, options.provider).limit(options.limit).execute();
  return rows.map(toProvidedMachine);
}

/**
 * {@link machinesForAgentStart} as a {@link Selection}, for
 * one-statement claims (`Session.work`, `ControlLoop.selectMachines`).
 */
export function agentStartSelection(
  db: Kysely<Database>,
  options: { provider: string },
): Selection<ProvidedMachine, MachineProvidedRow> {
  return {
    process: Process.ShepherdAgentStart,
    query: agentStartQuery(db, options.provider),
    toCandidate: toProvidedMachine,
  };
}

/**
 * Machines of `provider` whose agent went silent: AgentStarted and either no
 * heartbeat `firstHeartbeatWithin` after the start, or a last heartbeat older
 * than `heartbeatWithin`; no live shepherd work, no running
 * ShepherdRecovery backoff, not held.
 */
export async function machinesForAgentRecovery(
  db: Kysely<Database>,
  options: { provider: string; limit: number } & RecoveryThresholds,
): Promise<ProvidedMachine[]> {
  const rows = await agentRecoveryQuery(db, options).limit(options.limit).execute();
  return rows.map(toProvidedMachine);
}

/** {@link machinesForAgentRecovery} as a {@link Selection}. */
export function agentRecoverySelection(
  db: Kysely<Database>,
  options: { provider: string } & RecoveryThresholds,
): Selection<ProvidedMachine, MachineProvidedRow> {
  return {
    process: Process.ShepherdRecovery,
    query: agentRecoveryQuery(db, options),
    toCandidate: toProvidedMachine,
  };
}

/**
 * The candidates come from `machine_agent_pending` (provided machines
 * without AgentStarted and not installed, kept by triggers of migrations
 * 0002 and 0009 in the same
 * transaction as the tags): index range scans, however many machines are
 * started. They are read from a random machine ID onwards, then from the
 * start of the range up to it, so parallel claims start at different
 * machines instead of all walking past the same few being claimed.
 */
function agentStartQuery(db: Kysely<Database>, provider: string) {
  const pending = sql<{ machine_id: string }>`(
    WITH start AS (SELECT gen_random_uuid() AS at)
    (SELECT machine_id FROM machine_agent_pending
     WHERE provider = ${provider} AND machine_id >= (SELECT at FROM start) ORDER BY machine_id)
    UNION ALL
    (SELECT machine_id FROM machine_agent_pending
     WHERE provider = ${provider} AND machine_id < (SELECT at FROM start) ORDER BY machine_id))`;
  return db
    .selectFrom(pending.as('pending'))
    .innerJoin('machine_provided as mp', 'mp.machine_id', 'pending.machine_id')
    .selectAll('mp')
    .where('mp.provider', '=', provider)
    .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
    .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', 'ShepherdAgentStart')}`)
    .where(sql<boolean>`NOT ${isHeld('mp.machine_id')}`);
}

/**
 * Lost agents come from two index range scans, one per way of going
 * silent: heartbeats older than the threshold (`machine_agent_heartbeat_at_idx`),
 * and agents without any heartbeat started before it (the partial
 * `machine_agent_started_silent_idx`). Healthy machines are in neither, and
 * neither are installed ones: their agent tags went with their report
 * (migration 0009). A machine installing is left alone while it shows life
 * within the installing threshold (a key probe per silent candidate).
 */
function agentRecoveryQuery(db: Kysely<Database>, options: { provider: string } & RecoveryThresholds) {
  const { firstWithin, within, installingWithin } = thresholdSeconds(options);
  const silent = db
    .selectFrom('machine_agent_heartbeat as h')
    .innerJoin('machine_agent_started as a', 'a.machine_id', 'h.machine_id')
    .select('h.machine_id')
    .where(sql<boolean>`h.agent_heartbeat_at < now() - make_interval(secs => ${within})`)
    .unionAll(
      db
        .selectFrom('machine_agent_started as a')
        .select('a.machine_id')
        .where('a.has_heartbeat', '=', false)
        .where(sql<boolean>`a.agent_started_at < now() - make_interval(secs => ${firstWithin})`)
        .where(sql<boolean>`NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = a.machine_id)`),
    );
  return db
    .selectFrom('machine_provided as mp')
    .selectAll('mp')
    .where('mp.provider', '=', options.provider)
    .where('mp.machine_id', 'in', silent)
    .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
    .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', 'ShepherdRecovery')}`)
    .where(sql<boolean>`NOT ${isHeld('mp.machine_id')}`)
    .where(sql<boolean>`NOT ${installingRecently('mp.machine_id', installingWithin)}`);
}

/**
 * One machine for an operator's power action: its Provided tag, unless work
 * of any shepherd process is live on it (a recovery, an agent start, another
 * power action). Held machines are offered: holds are for working on
 * machines, power actions included.
 */
export function powerActionSelection(
  db: Kysely<Database>,
  machineId: string,
): Selection<ProvidedMachine, MachineProvidedRow> {
  return selectionFor(Process.ShepherdPowerAction, {
    query: db.selectFrom('machine_provided').selectAll().where('machine_id', '=', machineId),
    toCandidate: toProvidedMachine,
    exclusiveWith: SHEPHERD_PROCESSES,
    includeHeld: true,
  });
}
