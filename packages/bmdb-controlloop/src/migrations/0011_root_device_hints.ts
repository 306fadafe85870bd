import { type Kysely, sql } from 'kysely';

/**
 * Root-device hints on OS installation requests:
 * `machine_os_installation_request.root_device_hints`, a jsonb object of
 * Metal3 `rootDeviceHints` (see root-device-hints.ts), handed to the agent
 * with the request. A request names its disk by path, by hints, or by both,
 * so `root_device` may now be NULL when hints are given (never both absent).
 * Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE machine_os_installation_request
      ADD COLUMN root_device_hints jsonb CHECK (jsonb_typeof(root_device_hints) = 'object'),
      ALTER COLUMN root_device DROP NOT NULL,
      ADD CONSTRAINT machine_os_installation_request_disk_named
        CHECK (root_device IS NOT NULL OR root_device_hints IS NOT NULL)`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DELETE FROM machine_os_installation_request WHERE root_device IS NULL`.execute(db);
  await sql`
    ALTER TABLE machine_os_installation_request
      DROP CONSTRAINT machine_os_installation_request_disk_named,
      ALTER COLUMN root_device SET NOT NULL,
      DROP COLUMN root_device_hints`.execute(db);
}
