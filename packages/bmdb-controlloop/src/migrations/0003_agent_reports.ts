import { type Kysely, sql } from 'kysely';

/**
 * The reports agents send the BMaaS server with their heartbeats, as tags of
 * their machine, after the original's `machine_hardware_report` and
 * `machine_os_installation_report`. Adds to the schema and changes nothing
 * in it. Released: never edit, add a migration.
 *
 * The reports are kept as the agent sent them (serialized protobuf), so the
 * BMDB does not depend on the agent API's version; each row carries when it
 * was last reported.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_hardware_report (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      -- A serialized cloud.bmaas.server.api.AgentHardwareReport.
      hardware_report_raw bytea NOT NULL,
      hardware_reported_at timestamptz NOT NULL
    )`.execute(db);
  await sql`
    CREATE TABLE machine_os_installation_report (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      -- The generation of the installation request the report answers.
      generation bigint NOT NULL,
      os_installation_result text NOT NULL CHECK (os_installation_result IN ('Success', 'Error')),
      -- A serialized cloud.bmaas.server.api.OSInstallationReport.
      os_installation_report_raw bytea NOT NULL,
      os_installation_reported_at timestamptz NOT NULL
    )`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TABLE machine_os_installation_report`.execute(db);
  await sql`DROP TABLE machine_hardware_report`.execute(db);
}
