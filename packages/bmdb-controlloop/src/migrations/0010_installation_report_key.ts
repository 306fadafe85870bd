import { type Kysely, sql } from 'kysely';

/**
 * The key of the agent that sent a machine's last OS installation report:
 * `machine_os_installation_report.agent_public_key`. A `Success` report
 * removes the machine's AgentStarted tag with the key heartbeats are
 * checked against, so when its answer is lost (the call's deadline passing
 * while the statement commits, a dropped connection, a server restart) the
 * agent's repeat of it could no longer be told from anyone's. With the key
 * kept beside the report, that repeat is answered as the first was (see
 * internal/agent-heartbeats.ts), and the agent goes on to reboot. NULL for
 * the reports stored before (a repeat of one is refused, as it was). Adds a
 * column and changes nothing else. Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE machine_os_installation_report ADD COLUMN agent_public_key bytea`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE machine_os_installation_report DROP COLUMN agent_public_key`.execute(db);
}
