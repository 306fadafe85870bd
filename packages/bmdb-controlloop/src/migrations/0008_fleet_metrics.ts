import { type Kysely, sql } from 'kysely';
import { hardwareTotals } from '../internal/hardware-totals.js';

/**
 * What the fleet gauges (`fleet-gauges.ts`) need to read the fleet per
 * provider and location at any fleet size without reading every machine.
 * Adds to the schema and changes nothing in it. Released: never edit, add a
 * migration.
 *
 * - The totals of each machine's last hardware report as columns of
 *   `machine_hardware_report`: CPU threads (over its CPUs), installed
 *   memory, block devices and their capacity, read from the report by
 *   `BMDB.recordAgentHeartbeat` as it stores it (`internal/hardware-totals.ts`);
 *   NULL for a report that could not be read. Reports stay stored as the
 *   agent sent them; those already stored are read here, 500 at a time.
 *   Beside them the machine's provider and location, kept by triggers (as
 *   `machine_agent_pending` keeps its provider).
 * - `fleet_location_totals`: per provider and location (`''` for none), the
 *   provided machines and the sums of their reports' totals, kept by
 *   triggers on `machine_provided` and `machine_hardware_report` from each
 *   row's own old and new values (a machine added, removed or moved; a
 *   report stored, changed or removed). Counting them instead would read
 *   every machine at each reading. Each place's totals are spread over 64
 *   rows by the last byte of the machine ID, so that concurrent writers
 *   (provisioners, heartbeat batches) rarely meet on one row; a reader sums
 *   them. The machines' count changes when machines come and go, the
 *   hardware sums once per agent start.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE fleet_location_totals (
      provider text NOT NULL,
      provider_location text NOT NULL,
      shard smallint NOT NULL,
      -- Provided machines here.
      machines bigint NOT NULL DEFAULT 0,
      -- Machines here whose hardware report was read, and its totals' sums.
      reported_machines bigint NOT NULL DEFAULT 0,
      cpu_threads numeric NOT NULL DEFAULT 0,
      memory_bytes numeric NOT NULL DEFAULT 0,
      disks numeric NOT NULL DEFAULT 0,
      disk_bytes numeric NOT NULL DEFAULT 0,
      PRIMARY KEY (provider, provider_location, shard)
    )`.execute(db);

  await sql`
    ALTER TABLE machine_hardware_report
      ADD COLUMN provider text,
      ADD COLUMN provider_location text,
      ADD COLUMN cpu_threads bigint,
      ADD COLUMN memory_bytes bigint,
      ADD COLUMN disks integer,
      ADD COLUMN disk_bytes bigint`.execute(db);

  // Adds to the totals of a place (its row of the machine's shard).
  await sql`
    CREATE FUNCTION bmdb_fleet_location_add(
      machine uuid, place_provider text, place_location text, add_machines bigint, add_reported bigint,
      add_cpu_threads numeric, add_memory_bytes numeric, add_disks numeric, add_disk_bytes numeric)
    RETURNS void LANGUAGE sql AS $$
      INSERT INTO fleet_location_totals AS t
        (provider, provider_location, shard, machines, reported_machines, cpu_threads, memory_bytes, disks, disk_bytes)
      VALUES (coalesce(place_provider, ''), coalesce(place_location, ''), get_byte(uuid_send(machine), 15) & 63,
              add_machines, add_reported, add_cpu_threads, add_memory_bytes, add_disks, add_disk_bytes)
      ON CONFLICT (provider, provider_location, shard) DO UPDATE SET
        machines = t.machines + excluded.machines,
        reported_machines = t.reported_machines + excluded.reported_machines,
        cpu_threads = t.cpu_threads + excluded.cpu_threads,
        memory_bytes = t.memory_bytes + excluded.memory_bytes,
        disks = t.disks + excluded.disks,
        disk_bytes = t.disk_bytes + excluded.disk_bytes
    $$`.execute(db);

  // A Provided tag counts one machine at its place, and takes the machine's
  // hardware report along when the place changes.
  await sql`
    CREATE FUNCTION bmdb_machine_provided_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(OLD.machine_id, OLD.provider, OLD.provider_location, -1, 0, 0, 0, 0, 0);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(NEW.machine_id, NEW.provider, NEW.provider_location, 1, 0, 0, 0, 0, 0);
        UPDATE machine_hardware_report SET provider = NEW.provider, provider_location = NEW.provider_location
        WHERE machine_id = NEW.machine_id;
      ELSE
        UPDATE machine_hardware_report SET provider = NULL, provider_location = NULL WHERE machine_id = OLD.machine_id;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_totals AFTER INSERT OR DELETE ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION bmdb_machine_provided_totals()`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_totals_moved AFTER UPDATE OF machine_id, provider, provider_location ON machine_provided
    FOR EACH ROW WHEN (NEW.machine_id IS DISTINCT FROM OLD.machine_id OR NEW.provider IS DISTINCT FROM OLD.provider
      OR NEW.provider_location IS DISTINCT FROM OLD.provider_location)
    EXECUTE FUNCTION bmdb_machine_provided_totals()`.execute(db);

  // A report is placed where its machine is when first stored.
  await sql`
    CREATE FUNCTION bmdb_hardware_report_placed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      SELECT mp.provider, mp.provider_location INTO NEW.provider, NEW.provider_location
      FROM machine_provided mp WHERE mp.machine_id = NEW.machine_id;
      RETURN NEW;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_hardware_report_placed BEFORE INSERT ON machine_hardware_report
    FOR EACH ROW EXECUTE FUNCTION bmdb_hardware_report_placed()`.execute(db);

  // A report that was read adds its totals at its place.
  await sql`
    CREATE FUNCTION bmdb_hardware_report_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') AND OLD.cpu_threads IS NOT NULL THEN
        PERFORM bmdb_fleet_location_add(OLD.machine_id, OLD.provider, OLD.provider_location, 0, -1,
          -OLD.cpu_threads, -OLD.memory_bytes, -OLD.disks, -OLD.disk_bytes);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.cpu_threads IS NOT NULL THEN
        PERFORM bmdb_fleet_location_add(NEW.machine_id, NEW.provider, NEW.provider_location, 0, 1,
          NEW.cpu_threads, NEW.memory_bytes, NEW.disks, NEW.disk_bytes);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_hardware_report_totals AFTER INSERT OR DELETE ON machine_hardware_report
    FOR EACH ROW EXECUTE FUNCTION bmdb_hardware_report_totals()`.execute(db);
  await sql`
    CREATE TRIGGER machine_hardware_report_totals_changed AFTER UPDATE ON machine_hardware_report
    FOR EACH ROW WHEN ((NEW.machine_id, NEW.provider, NEW.provider_location, NEW.cpu_threads, NEW.memory_bytes,
        NEW.disks, NEW.disk_bytes)
      IS DISTINCT FROM (OLD.machine_id, OLD.provider, OLD.provider_location, OLD.cpu_threads, OLD.memory_bytes,
        OLD.disks, OLD.disk_bytes))
    EXECUTE FUNCTION bmdb_hardware_report_totals()`.execute(db);

  // What is stored already: the machines counted, the reports placed (their
  // totals still NULL: nothing to add), then read.
  await sql`
    INSERT INTO fleet_location_totals (provider, provider_location, shard, machines)
    SELECT provider, coalesce(provider_location, ''), get_byte(uuid_send(machine_id), 15) & 63, count(*)
    FROM machine_provided GROUP BY 1, 2, 3`.execute(db);
  await sql`
    UPDATE machine_hardware_report h SET provider = mp.provider, provider_location = mp.provider_location
    FROM machine_provided mp WHERE mp.machine_id = h.machine_id`.execute(db);
  await readStoredReports(db);
}

/** The totals of every report stored before this migration, in batches in machine ID order. */
async function readStoredReports(db: Kysely<unknown>): Promise<void> {
  let after = '00000000-0000-0000-0000-000000000000';
  for (;;) {
    const { rows } = await sql<{ machine_id: string; hardware_report_raw: Uint8Array }>`
      SELECT machine_id, hardware_report_raw FROM machine_hardware_report
      WHERE machine_id > ${after}::uuid ORDER BY machine_id LIMIT 500`.execute(db);
    const last = rows.at(-1);
    if (last === undefined) return;
    const totals = rows.map((row) => hardwareTotals(row.hardware_report_raw));
    await sql`
      UPDATE machine_hardware_report h
      SET cpu_threads = t.cpu_threads, memory_bytes = t.memory_bytes, disks = t.disks, disk_bytes = t.disk_bytes
      FROM unnest(${rows.map((row) => row.machine_id)}::uuid[], ${totals.map((t) => t?.cpuThreads ?? null)}::bigint[],
                  ${totals.map((t) => t?.memoryBytes ?? null)}::bigint[], ${totals.map((t) => t?.disks ?? null)}::int[],
                  ${totals.map((t) => t?.diskBytes ?? null)}::bigint[])
        AS t (machine_id, cpu_threads, memory_bytes, disks, disk_bytes)
      WHERE h.machine_id = t.machine_id`.execute(db);
    after = last.machine_id;
  }
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_hardware_report_totals_changed ON machine_hardware_report`.execute(db);
  await sql`DROP TRIGGER machine_hardware_report_totals ON machine_hardware_report`.execute(db);
  await sql`DROP FUNCTION bmdb_hardware_report_totals()`.execute(db);
  await sql`DROP TRIGGER machine_hardware_report_placed ON machine_hardware_report`.execute(db);
  await sql`DROP FUNCTION bmdb_hardware_report_placed()`.execute(db);
  await sql`DROP TRIGGER machine_provided_totals_moved ON machine_provided`.execute(db);
  await sql`DROP TRIGGER machine_provided_totals ON machine_provided`.execute(db);
  await sql`DROP FUNCTION bmdb_machine_provided_totals()`.execute(db);
  await sql`DROP FUNCTION bmdb_fleet_location_add(uuid, text, text, bigint, bigint, numeric, numeric, numeric, numeric)`.execute(
    db,
  );
  await sql`
    ALTER TABLE machine_hardware_report
      DROP COLUMN disk_bytes, DROP COLUMN disks, DROP COLUMN memory_bytes, DROP COLUMN cpu_threads,
      DROP COLUMN provider_location, DROP COLUMN provider`.execute(db);
  await sql`DROP TABLE fleet_location_totals`.execute(db);
}
