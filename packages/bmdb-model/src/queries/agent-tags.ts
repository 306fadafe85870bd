/** The agent's tags: AgentStarted, AgentHeartbeat and the reports its agent sent. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { type Kysely, sql } from 'kysely';
import type { HardwareReportEntry, OSInstallationReportEntry } from '../agent-heartbeat-check.js';
import type { Database } from '../schema.js';
import { databaseNow } from './fleet-stats.js';

/** A machine with a started agent (the AgentStarted tag). */
export interface StartedAgent {
  readonly machineId: string;
  readonly startedAt: Date;
}

/** An agent heartbeat dated ahead of the database's clock (see {@link agentHeartbeatsAhead}). */
export interface HeartbeatAhead {
  readonly machineId: string;
  readonly providerId: string;
  readonly heartbeatAt: Date;
}

/** Heartbeats written per statement by {@link setAgentHeartbeats}: two parameters each, well under PostgreSQL's 65535. */
const HEARTBEATS_PER_STATEMENT = 10_000;

/** Sets (or replaces) the AgentStarted tag. `startedAt` defaults to the database's now. */
export async function setAgentStarted(
  db: Kysely<Database>,
  machineId: string,
  agent: { publicKey: Uint8Array; startedAt?: Date },
): Promise<void> {
  const startedAt = agent.startedAt ?? sql<Date>`now()`;
  try {
    await db
      .insertInto('machine_agent_started')
      .values({ machine_id: machineId, agent_started_at: startedAt, agent_public_key: agent.publicKey })
      .onConflict((oc) =>
        oc.column('machine_id').doUpdateSet({ agent_started_at: startedAt, agent_public_key: agent.publicKey }),
      )
      .execute();
  } catch (error) {
    // Migration 0009's trigger: an installed machine runs its OS, not an agent.
    if (isInstalledRefusal(error)) throw new BMDBError(error.message, { cause: error });
    throw error;
  }
}

function isInstalledRefusal(error: unknown): error is Error {
  return (
    error instanceof Error && (error as { constraint?: unknown }).constraint === 'machine_agent_started_not_installed'
  );
}

/** Removes the AgentStarted tag, if any. */
export async function deleteAgentStarted(db: Kysely<Database>, machineId: string): Promise<void> {
  await db.deleteFrom('machine_agent_started').where('machine_id', '=', machineId).execute();
}

/** The machines of `provider` whose agent was started (AgentStarted), and when. */
export async function startedAgents(db: Kysely<Database>, provider: string): Promise<StartedAgent[]> {
  const rows = await db
    .selectFrom('machine_agent_started as a')
    .innerJoin('machine_provided as p', 'p.machine_id', 'a.machine_id')
    .where('p.provider', '=', provider)
    .select(['a.machine_id', 'a.agent_started_at'])
    .execute();
  return rows.map((row) => ({ machineId: row.machine_id, startedAt: row.agent_started_at }));
}

/** Records an agent heartbeat at `at` (default, and at most, the database's now). */
export async function setAgentHeartbeat(db: Kysely<Database>, machineId: string, at?: Date): Promise<void> {
  // Never later than the database's now: a writer whose clock runs fast
  // would otherwise keep a silent agent looking alive until its time comes.
  const heartbeatAt = at === undefined ? sql<Date>`now()` : sql<Date>`least(${at}::timestamptz, now())`;
  await db
    .insertInto('machine_agent_heartbeat')
    .values({ machine_id: machineId, agent_heartbeat_at: heartbeatAt })
    .onConflict((oc) => oc.column('machine_id').doUpdateSet({ agent_heartbeat_at: heartbeatAt }))
    .execute();
}

/** Removes the AgentHeartbeat tag, if any. */
export async function deleteAgentHeartbeat(db: Kysely<Database>, machineId: string): Promise<void> {
  await db.deleteFrom('machine_agent_heartbeat').where('machine_id', '=', machineId).execute();
}

/**
 * Records a heartbeat at the database's now for each of `machineIds`, a
 * few statements for any number (two parameters a machine, well under
 * PostgreSQL's 65535 per statement).
 */
export async function setAgentHeartbeats(db: Kysely<Database>, machineIds: readonly string[]): Promise<void> {
  for (let i = 0; i < machineIds.length; i += HEARTBEATS_PER_STATEMENT) {
    await db
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

/**
 * The heartbeats of `provider`'s machines dated more than `toleranceSeconds`
 * after the database's now, and that now: an index range scan
 * (`machine_agent_heartbeat_at_idx`).
 */
export async function agentHeartbeatsAhead(
  db: Kysely<Database>,
  options: {
    provider: string;
    toleranceSeconds: number;
  },
): Promise<{ now: Date; heartbeats: HeartbeatAhead[] }> {
  // The database's clock, not ours: it is the one the recovery selection compares with.
  const now = await databaseNow(db);
  const rows = await db
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
export async function hardwareReport(
  db: Kysely<Database>,
  machineId: string,
): Promise<HardwareReportEntry | undefined> {
  const row = await db
    .selectFrom('machine_hardware_report')
    .selectAll()
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return row && { machineId: row.machine_id, raw: row.hardware_report_raw, reportedAt: row.hardware_reported_at };
}

/** The machine's last OS installation report from its agent, if any. */
export async function osInstallationReport(
  db: Kysely<Database>,
  machineId: string,
): Promise<OSInstallationReportEntry | undefined> {
  const row = await db
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
