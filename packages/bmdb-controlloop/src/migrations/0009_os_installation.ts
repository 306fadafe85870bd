import { type Kysely, sql } from 'kysely';

/**
 * OS installation requests, handed to agents with their heartbeats. Adds to
 * the schema; replaces two trigger functions of 0002 so that installed
 * machines are never pending an agent start. Released: never edit, add a
 * migration.
 *
 * - `machine_os_installation_request`: the machine's current request (after
 *   the original's tag of the same name), one row per machine: its
 *   generation, the disk image (URL, sha256 of the bytes as downloaded, root
 *   device, compression, cloud-init user-data), who requested it and when,
 *   and where it stands (`installation_state`): `Requested`, `Delivered` (an
 *   agent got it in a heartbeat's answer and has not reported yet),
 *   `Succeeded` or `Failed` (the agent's report of this generation, with its
 *   error), `Canceled`. A new request replaces the row with the next
 *   generation, which is never one reported before (see
 *   queries/os-installation.ts), so a late report of an older request can
 *   never pass for one of the new. Who requested or canceled and why is in
 *   `operator_history`. `machine_os_installation_request_state_idx` serves
 *   the counts per state and the fleet page's filter.
 * - Installed machines (state `Succeeded`) run their OS, not the agent: they
 *   are kept out of `machine_agent_pending`, so the initializer never starts
 *   an agent on them, until a new request or a cancellation changes the
 *   state (a trigger puts the machine back, and wakes the loops). An agent
 *   started on one anyway (AgentStarted set by hand) is refused, so an
 *   installed machine never also counts as starting, heartbeating or silent.
 * - The installed machines per place, for the fleet gauges: each request row
 *   carries its machine's provider and location (as 0008's holds do, kept in
 *   step with the Provided tag by triggers) and counts one `installed`
 *   machine in `fleet_location_totals` while it is `Succeeded`, so a fleet of
 *   installed machines is read in a few rows a place, not a row a machine.
 *
 * Numbered after 0008: 0008 was released before this migration was, and
 * migrations run in the order of their names.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_os_installation_request (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      generation bigint NOT NULL CHECK (generation > 0),
      image_url text NOT NULL CHECK (image_url ~ '^https?://'),
      image_sha256 text NOT NULL CHECK (image_sha256 ~ '^[0-9a-f]{64}$'),
      root_device text NOT NULL CHECK (root_device LIKE '/%'),
      compression text NOT NULL CHECK (compression IN ('none', 'gzip')),
      user_data bytea,
      requested_at timestamptz NOT NULL DEFAULT now(),
      requested_by text NOT NULL,
      installation_state text NOT NULL DEFAULT 'Requested'
        CHECK (installation_state IN ('Requested', 'Delivered', 'Succeeded', 'Failed', 'Canceled')),
      -- When an agent first got this generation in a heartbeat's answer.
      delivered_at timestamptz,
      -- When its report was stored, or the request canceled.
      installation_ended_at timestamptz,
      -- The agent's error, for Failed.
      installation_error text,
      -- Its machine's place, for fleet_location_totals: kept by triggers.
      provider text,
      provider_location text
    )`.execute(db);
  await sql`
    CREATE INDEX machine_os_installation_request_state_idx
    ON machine_os_installation_request (installation_state, machine_id)`.execute(db);

  // 0002's pending triggers, each with "and not installed".
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_pending_provided() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM machine_agent_pending WHERE machine_id = OLD.machine_id;
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE')
         AND NOT EXISTS (SELECT 1 FROM machine_agent_started WHERE machine_id = NEW.machine_id)
         AND NOT EXISTS (SELECT 1 FROM machine_os_installation_request
                         WHERE machine_id = NEW.machine_id AND installation_state = 'Succeeded') THEN
        INSERT INTO machine_agent_pending (machine_id, provider) VALUES (NEW.machine_id, NEW.provider)
        ON CONFLICT (machine_id) DO UPDATE SET provider = excluded.provider;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_pending_started() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      ELSIF NOT EXISTS (SELECT 1 FROM machine_os_installation_request
                        WHERE machine_id = OLD.machine_id AND installation_state = 'Succeeded') THEN
        INSERT INTO machine_agent_pending (machine_id, provider)
        SELECT machine_id, provider FROM machine_provided WHERE machine_id = OLD.machine_id
        ON CONFLICT (machine_id) DO NOTHING;
      END IF;
      RETURN NULL;
    END $$`.execute(db);

  // A machine leaving Succeeded (a new request) is pending again if it has no
  // agent; one entering it is not. A request deleted with its machine finds
  // no machine to put back.
  await sql`
    CREATE FUNCTION bmdb_agent_pending_installation() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP <> 'DELETE' AND NEW.installation_state = 'Succeeded' THEN
        DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      ELSIF TG_OP <> 'INSERT' AND OLD.installation_state = 'Succeeded' THEN
        INSERT INTO machine_agent_pending (machine_id, provider)
        SELECT mp.machine_id, mp.provider FROM machine_provided mp
        WHERE mp.machine_id = OLD.machine_id
          AND EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = OLD.machine_id)
          AND NOT EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = OLD.machine_id)
        ON CONFLICT (machine_id) DO NOTHING;
        IF FOUND THEN
          PERFORM pg_notify('bmdb_machines_changed', TG_TABLE_NAME);
        END IF;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_os_installation_request_pending
    AFTER INSERT OR DELETE OR UPDATE OF installation_state ON machine_os_installation_request
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_installation()`.execute(db);

  // An installed machine runs its OS: no agent is started on it.
  await sql`
    CREATE FUNCTION bmdb_agent_started_not_installed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM machine_os_installation_request
                 WHERE machine_id = NEW.machine_id AND installation_state = 'Succeeded') THEN
        RAISE EXCEPTION 'machine % is installed (its OS installation succeeded): request an installation again before starting its agent', NEW.machine_id
          USING ERRCODE = 'check_violation', CONSTRAINT = 'machine_agent_started_not_installed';
      END IF;
      RETURN NEW;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_started_not_installed BEFORE INSERT ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_started_not_installed()`.execute(db);

  // A request takes its machine's place when made (0008's bmdb_placed), and
  // follows the Provided tag's.
  await sql`
    CREATE TRIGGER machine_os_installation_request_placed BEFORE INSERT ON machine_os_installation_request
    FOR EACH ROW EXECUTE FUNCTION bmdb_placed()`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_installation_request_place() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'DELETE' THEN
        UPDATE machine_os_installation_request SET provider = NULL, provider_location = NULL
        WHERE machine_id = OLD.machine_id AND (provider IS NOT NULL OR provider_location IS NOT NULL);
      ELSE
        UPDATE machine_os_installation_request SET provider = NEW.provider, provider_location = NEW.provider_location
        WHERE machine_id = NEW.machine_id
          AND (provider, provider_location) IS DISTINCT FROM (NEW.provider, NEW.provider_location);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_installation_place AFTER INSERT OR DELETE ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION bmdb_installation_request_place()`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_installation_place_moved
    AFTER UPDATE OF machine_id, provider, provider_location ON machine_provided
    FOR EACH ROW WHEN (NEW.machine_id IS DISTINCT FROM OLD.machine_id OR NEW.provider IS DISTINCT FROM OLD.provider
      OR NEW.provider_location IS DISTINCT FROM OLD.provider_location)
    EXECUTE FUNCTION bmdb_installation_request_place()`.execute(db);

  // A Succeeded request counts one installed machine at its place; what a
  // row counted it takes back itself, so a machine's deletion cascades in
  // any order.
  await sql`ALTER TABLE fleet_location_totals ADD COLUMN installed bigint NOT NULL DEFAULT 0`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_installed_add(machine uuid, place_provider text, place_location text, delta bigint)
    RETURNS void LANGUAGE sql AS $$
      INSERT INTO fleet_location_totals AS t (provider, provider_location, shard, installed)
      VALUES (coalesce(place_provider, ''), coalesce(place_location, ''), get_byte(uuid_send(machine), 15) & 63, delta)
      ON CONFLICT (provider, provider_location, shard) DO UPDATE SET installed = t.installed + excluded.installed
    $$`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_installed_totals() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('DELETE', 'UPDATE') AND OLD.installation_state = 'Succeeded' THEN
        PERFORM bmdb_installed_add(OLD.machine_id, OLD.provider, OLD.provider_location, -1);
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.installation_state = 'Succeeded' THEN
        PERFORM bmdb_installed_add(NEW.machine_id, NEW.provider, NEW.provider_location, 1);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_os_installation_request_totals AFTER INSERT OR DELETE ON machine_os_installation_request
    FOR EACH ROW EXECUTE FUNCTION bmdb_installed_totals()`.execute(db);
  await sql`
    CREATE TRIGGER machine_os_installation_request_totals_changed AFTER UPDATE ON machine_os_installation_request
    FOR EACH ROW WHEN ((NEW.machine_id, NEW.provider, NEW.provider_location, NEW.installation_state = 'Succeeded')
      IS DISTINCT FROM (OLD.machine_id, OLD.provider, OLD.provider_location, OLD.installation_state = 'Succeeded'))
    EXECUTE FUNCTION bmdb_installed_totals()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  for (const [table, trigger] of [
    ['machine_os_installation_request', 'machine_os_installation_request_totals_changed'],
    ['machine_os_installation_request', 'machine_os_installation_request_totals'],
    ['machine_os_installation_request', 'machine_os_installation_request_placed'],
    ['machine_provided', 'machine_provided_installation_place_moved'],
    ['machine_provided', 'machine_provided_installation_place'],
    ['machine_agent_started', 'machine_agent_started_not_installed'],
  ] as const) {
    await sql`DROP TRIGGER ${sql.id(trigger)} ON ${sql.table(table)}`.execute(db);
  }
  await sql`DROP FUNCTION bmdb_installed_totals()`.execute(db);
  await sql`DROP FUNCTION bmdb_installed_add(uuid, text, text, bigint)`.execute(db);
  await sql`ALTER TABLE fleet_location_totals DROP COLUMN installed`.execute(db);
  await sql`DROP FUNCTION bmdb_installation_request_place()`.execute(db);
  await sql`DROP FUNCTION bmdb_agent_started_not_installed()`.execute(db);
  await sql`DROP TRIGGER machine_os_installation_request_pending ON machine_os_installation_request`.execute(db);
  await sql`DROP FUNCTION bmdb_agent_pending_installation()`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_pending_provided() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM machine_agent_pending WHERE machine_id = OLD.machine_id;
      END IF;
      IF TG_OP IN ('INSERT', 'UPDATE')
         AND NOT EXISTS (SELECT 1 FROM machine_agent_started WHERE machine_id = NEW.machine_id) THEN
        INSERT INTO machine_agent_pending (machine_id, provider) VALUES (NEW.machine_id, NEW.provider)
        ON CONFLICT (machine_id) DO UPDATE SET provider = excluded.provider;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_pending_started() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      ELSE
        INSERT INTO machine_agent_pending (machine_id, provider)
        SELECT machine_id, provider FROM machine_provided WHERE machine_id = OLD.machine_id
        ON CONFLICT (machine_id) DO NOTHING;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  // Installed machines without an agent were kept out of the pending ones.
  await sql`
    INSERT INTO machine_agent_pending (machine_id, provider)
    SELECT mp.machine_id, mp.provider FROM machine_provided mp
    WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = mp.machine_id)
    ON CONFLICT (machine_id) DO NOTHING`.execute(db);
  await sql`DROP TABLE machine_os_installation_request`.execute(db);
}
