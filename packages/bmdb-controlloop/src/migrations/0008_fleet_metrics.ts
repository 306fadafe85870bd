import { type Kysely, sql } from 'kysely';
import { hardwareTotals } from '../hardware-totals.js';

/**
 * What the fleet gauges (`fleet-gauges.ts`) need to read the fleet per
 * provider and location at any fleet size without reading every machine.
 * Adds to the schema and changes nothing in it. Released: never edit, add a
 * migration.
 *
 * - The totals of each machine's last hardware report as columns of
 *   `machine_hardware_report`: CPU threads (over its CPUs), installed
 *   memory, block devices and their capacity, read from the report by
 *   the model's `AgentHeartbeats` as it stores it (`hardware-totals.ts`);
 *   NULL for a report that could not be read. Reports stay stored as the
 *   agent sent them; those already stored are read here, 500 at a time.
 * - The machine's place (provider and location) on the rows whose counts go
 *   by it: `machine_hardware_report`, `machine_hold` and (its location;
 *   0006 keeps its provider) `machine_power_state`. Taken from the Provided
 *   tag when the row is made, and kept in step with it by triggers (as
 *   `machine_agent_pending` keeps its provider).
 * - `fleet_location_totals`: per provider and location (`''` for none), the
 *   provided machines, the sums of their reports' totals, the machines held,
 *   per power state and whose power read failed. Kept by triggers on those
 *   tables and `machine_provided`, each adding what its own row counts at its
 *   own place and taking back what its old row counted at its old one (a
 *   machine added, removed or moved; a report stored or changed; a hold
 *   taken or released; a power state changed), so the order in which a
 *   machine's rows go when it is deleted does not matter. Counting them
 *   instead would read every machine at each reading. Each place's totals
 *   are spread over 64 rows by the last byte of the machine ID, so that
 *   concurrent writers (provisioners, heartbeat batches, power syncs) rarely
 *   meet on one row; a reader sums them. The power sync's reads of an
 *   unchanged state change nothing here.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await createTotalsTable(db);
  await placeStoredRows(db);
  await createTotalsAdder(db);
  await countProvidedMachines(db);
  await placeNewRows(db);
  await countReports(db);
  await countHolds(db);
  await countPowerStates(db);
  await countStoredRows(db);
  await readStoredReports(db);
}

/** The totals per place, spread over 64 shards. */
async function createTotalsTable(db: Kysely<unknown>): Promise<void> {
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
      -- Machines here held, per power state (unread: never read), whose last power read failed.
      held bigint NOT NULL DEFAULT 0,
      power_on bigint NOT NULL DEFAULT 0,
      power_off bigint NOT NULL DEFAULT 0,
      powering_on bigint NOT NULL DEFAULT 0,
      powering_off bigint NOT NULL DEFAULT 0,
      power_unknown bigint NOT NULL DEFAULT 0,
      power_unread bigint NOT NULL DEFAULT 0,
      power_read_failed bigint NOT NULL DEFAULT 0,
      PRIMARY KEY (provider, provider_location, shard)
    )`.execute(db);
}

/** The place columns of the rows that count by place, and the places of those stored already. */
async function placeStoredRows(db: Kysely<unknown>): Promise<void> {
  await sql`
    ALTER TABLE machine_hardware_report
      ADD COLUMN provider text,
      ADD COLUMN provider_location text,
      ADD COLUMN cpu_threads bigint,
      ADD COLUMN memory_bytes bigint,
      ADD COLUMN disks integer,
      ADD COLUMN disk_bytes bigint`.execute(db);
  await sql`ALTER TABLE machine_hold ADD COLUMN provider text, ADD COLUMN provider_location text`.execute(db);
  await sql`ALTER TABLE machine_power_state ADD COLUMN provider_location text`.execute(db);
  // The places of the rows stored already, before any trigger counts them.
  await sql`
    UPDATE machine_hardware_report h SET provider = mp.provider, provider_location = mp.provider_location
    FROM machine_provided mp WHERE mp.machine_id = h.machine_id`.execute(db);
  await sql`
    UPDATE machine_hold h SET provider = mp.provider, provider_location = mp.provider_location
    FROM machine_provided mp WHERE mp.machine_id = h.machine_id`.execute(db);
  await sql`
    UPDATE machine_power_state ps SET provider_location = mp.provider_location
    FROM machine_provided mp WHERE mp.machine_id = ps.machine_id`.execute(db);
}

/** `bmdb_fleet_location_add`, which every counting trigger calls. */
async function createTotalsAdder(db: Kysely<unknown>): Promise<void> {
  // Adds to the totals of a place (its row of the machine's shard); each
  // caller names what it adds.
  await sql`
    CREATE FUNCTION bmdb_fleet_location_add(
      machine uuid, place_provider text, place_location text,
      add_machines bigint DEFAULT 0, add_reported bigint DEFAULT 0, add_cpu_threads numeric DEFAULT 0,
      add_memory_bytes numeric DEFAULT 0, add_disks numeric DEFAULT 0, add_disk_bytes numeric DEFAULT 0,
      add_held bigint DEFAULT 0, add_power_on bigint DEFAULT 0, add_power_off bigint DEFAULT 0,
      add_powering_on bigint DEFAULT 0, add_powering_off bigint DEFAULT 0, add_power_unknown bigint DEFAULT 0,
      add_power_unread bigint DEFAULT 0, add_power_read_failed bigint DEFAULT 0)
    RETURNS void LANGUAGE sql AS $$
      INSERT INTO fleet_location_totals AS t
        (provider, provider_location, shard, machines, reported_machines, cpu_threads, memory_bytes, disks,
         disk_bytes, held, power_on, power_off, powering_on, powering_off, power_unknown, power_unread,
         power_read_failed)
      VALUES (coalesce(place_provider, ''), coalesce(place_location, ''), get_byte(uuid_send(machine), 15) & 63,
              add_machines, add_reported, add_cpu_threads, add_memory_bytes, add_disks, add_disk_bytes, add_held,
              add_power_on, add_power_off, add_powering_on, add_powering_off, add_power_unknown, add_power_unread,
              add_power_read_failed)
      ON CONFLICT (provider, provider_location, shard) DO UPDATE SET
        machines = t.machines + excluded.machines,
        reported_machines = t.reported_machines + excluded.reported_machines,
        cpu_threads = t.cpu_threads + excluded.cpu_threads,
        memory_bytes = t.memory_bytes + excluded.memory_bytes,
        disks = t.disks + excluded.disks,
        disk_bytes = t.disk_bytes + excluded.disk_bytes,
        held = t.held + excluded.held,
        power_on = t.power_on + excluded.power_on,
        power_off = t.power_off + excluded.power_off,
        powering_on = t.powering_on + excluded.powering_on,
        powering_off = t.powering_off + excluded.powering_off,
        power_unknown = t.power_unknown + excluded.power_unknown,
        power_unread = t.power_unread + excluded.power_unread,
        power_read_failed = t.power_read_failed + excluded.power_read_failed
    $$`.execute(db);
}

/** The Provided tag's trigger: machines per place, and the places of the machine's other rows. */
async function countProvidedMachines(db: Kysely<unknown>): Promise<void> {
  // A Provided tag counts one machine at its place, and moves the rows that
  // count at the machine's place with it (0006's trigger keeps the power
  // state's provider and deletes it with the tag; a hold and a report stay).
  await sql`
    CREATE FUNCTION bmdb_machine_provided_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(OLD.machine_id, OLD.provider, OLD.provider_location, add_machines => -1);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(NEW.machine_id, NEW.provider, NEW.provider_location, add_machines => 1);
        -- Only rows whose place changes are written (a power state made with
        -- the tag has taken its place already).
        UPDATE machine_hardware_report SET provider = NEW.provider, provider_location = NEW.provider_location
        WHERE machine_id = NEW.machine_id
          AND (provider, provider_location) IS DISTINCT FROM (NEW.provider, NEW.provider_location);
        UPDATE machine_hold SET provider = NEW.provider, provider_location = NEW.provider_location
        WHERE machine_id = NEW.machine_id
          AND (provider, provider_location) IS DISTINCT FROM (NEW.provider, NEW.provider_location);
        UPDATE machine_power_state SET provider_location = NEW.provider_location
        WHERE machine_id = NEW.machine_id AND provider_location IS DISTINCT FROM NEW.provider_location;
      ELSE
        UPDATE machine_hardware_report SET provider = NULL, provider_location = NULL
        WHERE machine_id = OLD.machine_id AND (provider IS NOT NULL OR provider_location IS NOT NULL);
        UPDATE machine_hold SET provider = NULL, provider_location = NULL
        WHERE machine_id = OLD.machine_id AND (provider IS NOT NULL OR provider_location IS NOT NULL);
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
}

/** `bmdb_placed`: a new report, hold or power state takes its machine's place. */
async function placeNewRows(db: Kysely<unknown>): Promise<void> {
  // A row made for a machine takes the machine's place.
  await sql`
    CREATE FUNCTION bmdb_placed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_TABLE_NAME = 'machine_power_state' THEN
        SELECT mp.provider_location INTO NEW.provider_location
        FROM machine_provided mp WHERE mp.machine_id = NEW.machine_id;
      ELSE
        SELECT mp.provider, mp.provider_location INTO NEW.provider, NEW.provider_location
        FROM machine_provided mp WHERE mp.machine_id = NEW.machine_id;
      END IF;
      RETURN NEW;
    END $$`.execute(db);
  for (const table of ['machine_hardware_report', 'machine_hold', 'machine_power_state']) {
    await sql`
      CREATE TRIGGER ${sql.id(`${table}_placed`)} BEFORE INSERT ON ${sql.table(table)}
      FOR EACH ROW EXECUTE FUNCTION bmdb_placed()`.execute(db);
  }
}

/** The hardware report's triggers: reports read per place and their totals. */
async function countReports(db: Kysely<unknown>): Promise<void> {
  // A report that was read adds its totals at its place.
  await sql`
    CREATE FUNCTION bmdb_hardware_report_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') AND OLD.cpu_threads IS NOT NULL THEN
        PERFORM bmdb_fleet_location_add(OLD.machine_id, OLD.provider, OLD.provider_location, add_reported => -1,
          add_cpu_threads => -OLD.cpu_threads, add_memory_bytes => -OLD.memory_bytes, add_disks => -OLD.disks,
          add_disk_bytes => -OLD.disk_bytes);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.cpu_threads IS NOT NULL THEN
        PERFORM bmdb_fleet_location_add(NEW.machine_id, NEW.provider, NEW.provider_location, add_reported => 1,
          add_cpu_threads => NEW.cpu_threads, add_memory_bytes => NEW.memory_bytes, add_disks => NEW.disks,
          add_disk_bytes => NEW.disk_bytes);
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
}

/** The hold's triggers: held machines per place. */
async function countHolds(db: Kysely<unknown>): Promise<void> {
  // A hold counts one held machine at its place.
  await sql`
    CREATE FUNCTION bmdb_hold_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(OLD.machine_id, OLD.provider, OLD.provider_location, add_held => -1);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM bmdb_fleet_location_add(NEW.machine_id, NEW.provider, NEW.provider_location, add_held => 1);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_hold_totals AFTER INSERT OR DELETE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION bmdb_hold_totals()`.execute(db);
  await sql`
    CREATE TRIGGER machine_hold_totals_moved AFTER UPDATE ON machine_hold
    FOR EACH ROW WHEN ((NEW.machine_id, NEW.provider, NEW.provider_location)
      IS DISTINCT FROM (OLD.machine_id, OLD.provider, OLD.provider_location))
    EXECUTE FUNCTION bmdb_hold_totals()`.execute(db);
}

/** The power state's triggers: machines per power state per place. */
async function countPowerStates(db: Kysely<unknown>): Promise<void> {
  // A power state counts its machine in its state (and among failed reads)
  // at its place.
  await sql`
    CREATE FUNCTION bmdb_power_state_add(state machine_power_state, delta bigint) RETURNS void LANGUAGE sql AS $$
      SELECT bmdb_fleet_location_add(state.machine_id, state.provider, state.provider_location,
        add_power_on => CASE WHEN state.power_state = 'On' THEN delta ELSE 0 END,
        add_power_off => CASE WHEN state.power_state = 'Off' THEN delta ELSE 0 END,
        add_powering_on => CASE WHEN state.power_state = 'PoweringOn' THEN delta ELSE 0 END,
        add_powering_off => CASE WHEN state.power_state = 'PoweringOff' THEN delta ELSE 0 END,
        add_power_unknown => CASE WHEN state.power_state = 'Unknown' THEN delta ELSE 0 END,
        add_power_unread => CASE WHEN state.power_state IS NULL THEN delta ELSE 0 END,
        add_power_read_failed => CASE WHEN state.power_read_failed_at IS NOT NULL THEN delta ELSE 0 END)
    $$`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_power_state_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') THEN
        PERFORM bmdb_power_state_add(OLD, -1);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM bmdb_power_state_add(NEW, 1);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_power_state_totals AFTER INSERT OR DELETE ON machine_power_state
    FOR EACH ROW EXECUTE FUNCTION bmdb_power_state_totals()`.execute(db);
  await sql`
    CREATE TRIGGER machine_power_state_totals_changed AFTER UPDATE ON machine_power_state
    FOR EACH ROW WHEN ((NEW.machine_id, NEW.provider, NEW.provider_location, NEW.power_state,
        NEW.power_read_failed_at IS NULL)
      IS DISTINCT FROM (OLD.machine_id, OLD.provider, OLD.provider_location, OLD.power_state,
        OLD.power_read_failed_at IS NULL))
    EXECUTE FUNCTION bmdb_power_state_totals()`.execute(db);
}

/** The totals of the rows stored before this migration. */
async function countStoredRows(db: Kysely<unknown>): Promise<void> {
  // What is stored already: everything counted but the reports' totals,
  // which their update adds as they are read.
  await sql`
    INSERT INTO fleet_location_totals AS t (provider, provider_location, shard, machines, held, power_on, power_off,
      powering_on, powering_off, power_unknown, power_unread, power_read_failed)
    SELECT coalesce(provider, ''), coalesce(location, ''), get_byte(uuid_send(machine_id), 15) & 63, sum(machines),
           sum(held), sum(power_on), sum(power_off), sum(powering_on), sum(powering_off), sum(power_unknown),
           sum(power_unread), sum(power_read_failed)
    FROM (
      SELECT provider, provider_location, machine_id, 1 AS machines, 0 AS held, 0 AS power_on, 0 AS power_off,
             0 AS powering_on, 0 AS powering_off, 0 AS power_unknown, 0 AS power_unread, 0 AS power_read_failed
      FROM machine_provided
      UNION ALL
      SELECT provider, provider_location, machine_id, 0, 1, 0, 0, 0, 0, 0, 0, 0 FROM machine_hold
      UNION ALL
      SELECT provider, provider_location, machine_id, 0, 0, (power_state = 'On')::int, (power_state = 'Off')::int,
             (power_state = 'PoweringOn')::int, (power_state = 'PoweringOff')::int, (power_state = 'Unknown')::int,
             (power_state IS NULL)::int, (power_read_failed_at IS NOT NULL)::int
      FROM machine_power_state) AS counted (provider, location, machine_id, machines, held, power_on, power_off,
        powering_on, powering_off, power_unknown, power_unread, power_read_failed)
    GROUP BY 1, 2, 3`.execute(db);
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
  for (const [table, triggers] of [
    [
      'machine_power_state',
      ['machine_power_state_totals_changed', 'machine_power_state_totals', 'machine_power_state_placed'],
    ],
    ['machine_hold', ['machine_hold_totals_moved', 'machine_hold_totals', 'machine_hold_placed']],
    [
      'machine_hardware_report',
      ['machine_hardware_report_totals_changed', 'machine_hardware_report_totals', 'machine_hardware_report_placed'],
    ],
    ['machine_provided', ['machine_provided_totals_moved', 'machine_provided_totals']],
  ] as const) {
    for (const trigger of triggers) await sql`DROP TRIGGER ${sql.id(trigger)} ON ${sql.table(table)}`.execute(db);
  }
  await sql`DROP FUNCTION bmdb_power_state_totals()`.execute(db);
  await sql`DROP FUNCTION bmdb_power_state_add(machine_power_state, bigint)`.execute(db);
  await sql`DROP FUNCTION bmdb_hold_totals()`.execute(db);
  await sql`DROP FUNCTION bmdb_hardware_report_totals()`.execute(db);
  await sql`DROP FUNCTION bmdb_placed()`.execute(db);
  await sql`DROP FUNCTION bmdb_machine_provided_totals()`.execute(db);
  await sql`
    DROP FUNCTION bmdb_fleet_location_add(uuid, text, text, bigint, bigint, numeric, numeric, numeric, numeric,
      bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint)`.execute(db);
  await sql`ALTER TABLE machine_power_state DROP COLUMN provider_location`.execute(db);
  await sql`ALTER TABLE machine_hold DROP COLUMN provider_location, DROP COLUMN provider`.execute(db);
  await sql`
    ALTER TABLE machine_hardware_report
      DROP COLUMN disk_bytes, DROP COLUMN disks, DROP COLUMN memory_bytes, DROP COLUMN cpu_threads,
      DROP COLUMN provider_location, DROP COLUMN provider`.execute(db);
  await sql`DROP TABLE fleet_location_totals`.execute(db);
}
