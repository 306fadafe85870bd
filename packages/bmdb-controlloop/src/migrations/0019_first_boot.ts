import { type Kysely, sql } from 'kysely';

/**
 * The installed OS's first boot (its config drive, and its report that it
 * booted) on `machine_os_installation_request`: `hostname`,
 * `ssh_public_keys` and `network` (the agent's network model as JSON) are
 * what a disk image request gives the installed OS; `boot_secret_sha256`
 * is the sha256 of the secret its agent put on the config drive, sent with
 * its `Success` report; `booted_at` and `booted_host_keys` are the OS's
 * report that it booted (with the SSH host keys it sent). A new request
 * clears them. Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE machine_os_installation_request
      ADD COLUMN hostname text,
      ADD COLUMN ssh_public_keys text[] NOT NULL DEFAULT '{}',
      ADD COLUMN network jsonb,
      ADD COLUMN boot_secret_sha256 bytea CHECK (octet_length(boot_secret_sha256) = 32),
      ADD COLUMN booted_at timestamptz,
      ADD COLUMN booted_host_keys text[],
      ADD CONSTRAINT machine_os_installation_request_booted_installed
        CHECK (booted_at IS NULL OR (installation_state = 'Succeeded' AND boot_secret_sha256 IS NOT NULL))`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE machine_os_installation_request
      DROP CONSTRAINT machine_os_installation_request_booted_installed,
      DROP COLUMN booted_host_keys,
      DROP COLUMN booted_at,
      DROP COLUMN boot_secret_sha256,
      DROP COLUMN network,
      DROP COLUMN ssh_public_keys,
      DROP COLUMN hostname`.execute(db);
}
