import { type Kysely, sql } from 'kysely';

/**
 * Network boots in the BMDB, so that every shepherd process's boot files
 * answer them, whichever process claimed the machine (queries/network-boot.ts).
 * Released: never edit, add a migration.
 *
 * - `machine_network_boot`: one row per machine, its last network boot: the
 *   boot's ID, the session of the agent booter's claim it was armed under,
 *   its capability (the path part of its script's and config's URLs), the
 *   machine's MACs its script is answered by, what its config holds that is
 *   no secret (the serialized TakeoverInit, the agent's flags) and how long
 *   the token minted when the config is served is good for; when it was
 *   armed and ended, to whom its config was served (once), and the first
 *   fetch of it that was refused. A boot is *live* while it has not ended
 *   and its claim is held by that session, alive; only a live boot is
 *   answered. The row stays after the end, so a late fetch of its config is
 *   recorded against the machine; the machine's next network boot replaces it.
 * - `machine_agent_enrollment.boot_id`: the boot a token was issued for, so
 *   the agent booter waiting for a boot's enrollment, renewing or revoking
 *   its token, touches that boot's token and no other; null for tokens
 *   issued without one.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_network_boot (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      boot_id uuid NOT NULL,
      session_id uuid NOT NULL,
      capability text NOT NULL UNIQUE CHECK (capability ~ '^[A-Za-z0-9_-]{43}$'),
      macs text[] NOT NULL,
      takeover_init bytea NOT NULL,
      agent_flags text[] NOT NULL,
      token_valid_seconds integer NOT NULL CHECK (token_valid_seconds > 0),
      armed_at timestamptz NOT NULL,
      ended_at timestamptz,
      config_served_at timestamptz,
      config_served_to text,
      config_refused_at timestamptz,
      config_refused_to text
    )`.execute(db);
  // iPXE asks by MAC: the live boots' MACs, one index lookup.
  await sql`
    CREATE INDEX machine_network_boot_macs_idx ON machine_network_boot USING gin (macs)
    WHERE ended_at IS NULL`.execute(db);
  await sql`ALTER TABLE machine_agent_enrollment ADD COLUMN boot_id uuid`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE machine_agent_enrollment DROP COLUMN boot_id`.execute(db);
  await sql`DROP TABLE machine_network_boot`.execute(db);
}
