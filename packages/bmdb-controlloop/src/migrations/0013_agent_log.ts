import { type Kysely, sql } from 'kysely';

/**
 * The agent's log as its heartbeats carry it (cloud/agent/api/agent_log.proto):
 * the tail of the agent's log file, at most 64 KiB of UTF-8 text, one row per
 * machine beside its hardware report, replaced by each heartbeat that carries
 * one, with when it was received. The bound is checked here too, so no
 * writer can store more. Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_agent_log (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      agent_log text NOT NULL CHECK (octet_length(agent_log) <= 65536),
      agent_log_received_at timestamptz NOT NULL
    )`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TABLE machine_agent_log`.execute(db);
}
