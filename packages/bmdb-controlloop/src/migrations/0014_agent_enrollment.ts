import { type Kysely, sql } from 'kysely';

/**
 * The enrollment of an agent its machine's BMC booted (queries/enrollment.ts):
 * one row per machine, its one-time enrollment token as a sha256 only (the
 * token itself is never stored), when it was issued, until when it is good,
 * and when it was used (null until then). A new token replaces the row.
 * Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_agent_enrollment (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      token_sha256 bytea NOT NULL CHECK (octet_length(token_sha256) = 32),
      issued_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      enrolled_at timestamptz,
      CHECK (expires_at > issued_at)
    )`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TABLE machine_agent_enrollment`.execute(db);
}
