/**
 * The shepherd's selections: machines whose agent must be started over SSH,
 * those whose agent went silent, and those whose BMC must boot their agent.
 */

import { hasLiveWork, inBackoff, isHeld, type Selection, selectionFor } from '@bmaas/bmdb-controlloop';
import { type Kysely, type RawBuilder, sql } from 'kysely';
import { type Database, type MachineProvidedRow, Process, SHEPHERD_PROCESSES } from '../schema.js';
import { type ProvidedMachine, toProvidedMachine } from './provided-tags.js';
import { installingRecently, type RecoveryThresholds, thresholdSeconds } from './recovery-thresholds.js';

/**
 * Machines of `provider` whose agent must be started over SSH: provided, no
 * AgentStarted tag, boot method `ssh`, no live shepherd work, no running
 * ShepherdAgentStart backoff, not held.
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
 * than `heartbeatWithin`; boot method `ssh` (a machine whose BMC boots its
 * agent is booted into it again, see {@link agentBootSelection}, not
 * power-cycled); no live shepherd work, no running ShepherdRecovery backoff,
 * not held.
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
 * Machines of `provider` whose BMC must boot their agent (boot method
 * `virtual-media` or `network`) because they need one:
 * - no AgentStarted tag: a machine never started (a blank one), or one whose
 *   agent a recovery removed;
 * - installed (its OS installation `Succeeded`, so its agent is gone by
 *   design) and asked for a newer request since, an installation or a disk
 *   wipe (a reinstall, `shepherd decommission --wipe` of an installed
 *   machine): the new request takes the machine out of `Succeeded`, which
 *   puts it back among the machines without an agent; an installed machine
 *   without a newer request is left alone, and so is one whose newer request
 *   was canceled before an agent came for it (its OS still runs);
 * - its agent silent past the recovery thresholds (the recoverer's, see
 *   {@link RecoveryThresholds}), unless it is installing and showed life
 *   within the installing threshold, as the recoverer has it: such a machine
 *   is booted into the agent again rather than power-cycled.
 *
 * No live shepherd work, no running ShepherdAgentBoot backoff, not held.
 */
export async function machinesForAgentBoot(
  db: Kysely<Database>,
  options: { provider: string; limit: number } & RecoveryThresholds,
): Promise<ProvidedMachine[]> {
  const rows = await agentBootQuery(db, options).limit(options.limit).execute();
  return rows.map(toProvidedMachine);
}

/**
 * Whether the machine still needs its BMC to boot its agent, as
 * {@link machinesForAgentBoot} has it (`options.provider` its provider's),
 * whatever work, backoff or hold it has: for the agent booter to check
 * again once it claimed the machine, before it resets it. A heartbeat whose
 * statement began before the claim committed may have settled the machine's
 * installation since (it runs its OS) or shown its silent agent alive, and
 * an operator may have canceled the reinstall it was taken for.
 */
export async function needsAgentBoot(
  db: Kysely<Database>,
  machineId: string,
  options: { provider: string } & RecoveryThresholds,
): Promise<boolean> {
  const { rows } = await sql<{ machine_id: string }>`
    SELECT needing.machine_id FROM ${needingAgentBoot(db, options)} AS needing
    WHERE needing.machine_id = ${machineId}`.execute(db);
  return rows.length > 0;
}

/** {@link machinesForAgentBoot} as a {@link Selection}, for one-statement claims of `ShepherdAgentBoot`. */
export function agentBootSelection(
  db: Kysely<Database>,
  options: { provider: string } & RecoveryThresholds,
): Selection<ProvidedMachine, MachineProvidedRow> {
  return {
    process: Process.ShepherdAgentBoot,
    query: agentBootQuery(db, options),
    toCandidate: toProvidedMachine,
  };
}

/**
 * The machines without an agent come from range scans of the partial index
 * `machine_agent_pending_boot_idx` (migration 0015), from a random machine ID
 * onwards then up to it, as the agent start's do; the silent ones from range
 * scans of the BMC-booted agents' partial indexes (migration 0018, see
 * {@link silentBmcBootedAgents}). SSH machines are in none, however many
 * there are and however many of their agents are silent.
 */
function agentBootQuery(db: Kysely<Database>, options: { provider: string } & RecoveryThresholds) {
  const { provider } = options;
  return db
    .selectFrom(needingAgentBoot(db, options).as('needing'))
    .innerJoin('machine_provided as mp', 'mp.machine_id', 'needing.machine_id')
    .selectAll('mp')
    .where('mp.provider', '=', provider)
    .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
    .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', Process.ShepherdAgentBoot)}`)
    .where(sql<boolean>`NOT ${isHeld('mp.machine_id')}`);
}

/**
 * The machines of `options.provider` whose BMC must boot their agent, by
 * their state alone (see {@link agentBootQuery}): the pending ones, but
 * those still running the OS of a report a canceled request did not
 * replace (two key probes each), and the silent ones.
 */
function needingAgentBoot(db: Kysely<Database>, options: { provider: string } & RecoveryThresholds) {
  const { provider } = options;
  const { installingWithin } = thresholdSeconds(options);
  return sql<{ machine_id: string }>`(
    WITH start AS (SELECT gen_random_uuid() AS at)
    (SELECT p.machine_id FROM machine_agent_pending p
     WHERE p.provider = ${provider} AND p.agent_boot AND p.machine_id >= (SELECT at FROM start)
       AND NOT ${stillInstalled('p.machine_id')} ORDER BY p.machine_id)
    UNION ALL
    (SELECT p.machine_id FROM machine_agent_pending p
     WHERE p.provider = ${provider} AND p.agent_boot AND p.machine_id < (SELECT at FROM start)
       AND NOT ${stillInstalled('p.machine_id')} ORDER BY p.machine_id)
    UNION ALL
    (SELECT silent.machine_id FROM (${silentBmcBootedAgents(db, options)}) AS silent
     WHERE NOT ${installingRecently('silent.machine_id', installingWithin)}))`;
}

/**
 * Whether the machine at `machineId`, pending an agent, still runs the OS
 * its last report installed: its newer request (a reinstall, a wipe) took
 * it out of `Succeeded` and was canceled before any agent reported on it,
 * so its report is still that `Success`. Booting it into the agent would
 * reset a running OS for nothing. Key probes of the request and the report.
 */
function stillInstalled(machineId: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (SELECT 1 FROM machine_os_installation_request sq
    JOIN machine_os_installation_report sr ON sr.machine_id = sq.machine_id
    WHERE sq.machine_id = ${sql.ref(machineId)} AND sq.installation_state = 'Canceled'
      AND sr.os_installation_result = 'Success')`;
}

/**
 * The candidates come from `machine_agent_pending` (provided machines
 * without AgentStarted and not installed, kept by triggers of migrations
 * 0002 and 0009 in the same
 * transaction as the tags), those taken over through SSH: range scans of
 * the partial index `machine_agent_pending_ssh_idx` (0015), however many
 * machines are started or wait for their BMC. They are read from a random
 * machine ID onwards, then from the start of the range up to it, so
 * parallel claims start at different machines instead of all walking past
 * the same few being claimed.
 */
function agentStartQuery(db: Kysely<Database>, provider: string) {
  const pending = sql<{ machine_id: string }>`(
    WITH start AS (SELECT gen_random_uuid() AS at)
    (SELECT machine_id FROM machine_agent_pending
     WHERE provider = ${provider} AND NOT agent_boot AND machine_id >= (SELECT at FROM start) ORDER BY machine_id)
    UNION ALL
    (SELECT machine_id FROM machine_agent_pending
     WHERE provider = ${provider} AND NOT agent_boot AND machine_id < (SELECT at FROM start) ORDER BY machine_id))`;
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
 * within the installing threshold (a key probe per silent candidate), and so
 * is a machine whose BMC boots its agent (a key probe of `machine_agent_boot`).
 */
function agentRecoveryQuery(db: Kysely<Database>, options: { provider: string } & RecoveryThresholds) {
  const { installingWithin } = thresholdSeconds(options);
  return db
    .selectFrom('machine_provided as mp')
    .selectAll('mp')
    .where('mp.provider', '=', options.provider)
    .where('mp.machine_id', 'in', silentAgents(db, options))
    .where(sql<boolean>`NOT ${bootedByBmc('mp.machine_id')}`)
    .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', SHEPHERD_PROCESSES)}`)
    .where(sql<boolean>`NOT ${inBackoff('mp.machine_id', 'ShepherdRecovery')}`)
    .where(sql<boolean>`NOT ${isHeld('mp.machine_id')}`)
    .where(sql<boolean>`NOT ${installingRecently('mp.machine_id', installingWithin)}`);
}

/**
 * The machines whose started agent went silent past the thresholds, whatever
 * their boot method (the recoverer's, which leaves out the BMC-booted ones): two index range scans, one per way of going silent
 * (`machine_agent_heartbeat_at_idx`, the partial `machine_agent_started_silent_idx`).
 */
function silentAgents(db: Kysely<Database>, thresholds: RecoveryThresholds) {
  const { firstWithin, within } = thresholdSeconds(thresholds);
  return db
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
}

/**
 * {@link silentAgents} of the machines whose BMC boots their agent alone: two
 * range scans of partial indexes holding only their agents
 * (`machine_agent_heartbeat_boot_idx` by heartbeat time, and
 * `machine_agent_started_boot_silent_idx` by start time for those that never
 * heartbeated), whose `agent_boot` flags triggers keep from `machine_agent_boot`.
 */
function silentBmcBootedAgents(db: Kysely<Database>, thresholds: RecoveryThresholds) {
  const { firstWithin, within } = thresholdSeconds(thresholds);
  return (
    db
      .selectFrom('machine_agent_heartbeat as h')
      .innerJoin('machine_agent_started as a', 'a.machine_id', 'h.machine_id')
      .select('h.machine_id')
      // Written out, not parameters: a generic plan's `= $1` would not match the partial indexes' predicates.
      .where(sql<boolean>`h.agent_boot`)
      .where(sql<boolean>`h.agent_heartbeat_at < now() - make_interval(secs => ${within})`)
      .unionAll(
        db
          .selectFrom('machine_agent_started as a')
          .select('a.machine_id')
          .where(sql<boolean>`a.agent_boot AND NOT a.has_heartbeat`)
          .where(sql<boolean>`a.agent_started_at < now() - make_interval(secs => ${firstWithin})`)
          .where(sql<boolean>`NOT EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = a.machine_id)`),
      )
  );
}

/** Whether the machine at `machineId` has its agent booted by its BMC: a primary-key probe of `machine_agent_boot`. */
function bootedByBmc(machineId: string): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (SELECT 1 FROM machine_agent_boot ab WHERE ab.machine_id = ${sql.ref(machineId)})`;
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
