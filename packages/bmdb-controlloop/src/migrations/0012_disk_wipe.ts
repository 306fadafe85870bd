import { type Kysely, sql } from 'kysely';

/**
 * Disk wipes as OS installation requests: `machine_os_installation_request.request_kind`
 * is `DiskImage` (every request before this migration) or `DiskWipe` (wipe
 * every disk's metadata, cloud/agent/api/disk_wipe.proto), requested, handed
 * out and reported as an installation is, with the same generations. A wipe
 * has no image and no disk to name, so the image's columns may now be NULL,
 * and must be for a wipe. `decommission`: the wipe was requested by
 * `shepherd decommission --wipe`, which removes the machine once it
 * succeeded. Released: never edit, add a migration.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE machine_os_installation_request
      ADD COLUMN request_kind text NOT NULL DEFAULT 'DiskImage' CHECK (request_kind IN ('DiskImage', 'DiskWipe')),
      ADD COLUMN decommission boolean NOT NULL DEFAULT false,
      ALTER COLUMN image_url DROP NOT NULL,
      ALTER COLUMN image_sha256 DROP NOT NULL,
      DROP CONSTRAINT machine_os_installation_request_disk_named,
      ADD CONSTRAINT machine_os_installation_request_kind_fields CHECK (
        CASE request_kind
          WHEN 'DiskImage' THEN image_url IS NOT NULL AND image_sha256 IS NOT NULL
            AND (root_device IS NOT NULL OR root_device_hints IS NOT NULL) AND NOT decommission
          ELSE image_url IS NULL AND image_sha256 IS NULL AND root_device IS NULL AND root_device_hints IS NULL
            AND user_data IS NULL
        END)`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DELETE FROM machine_os_installation_request WHERE request_kind = 'DiskWipe'`.execute(db);
  await sql`
    ALTER TABLE machine_os_installation_request
      DROP CONSTRAINT machine_os_installation_request_kind_fields,
      ADD CONSTRAINT machine_os_installation_request_disk_named
        CHECK (root_device IS NOT NULL OR root_device_hints IS NOT NULL),
      ALTER COLUMN image_url SET NOT NULL,
      ALTER COLUMN image_sha256 SET NOT NULL,
      DROP COLUMN decommission,
      DROP COLUMN request_kind`.execute(db);
}
