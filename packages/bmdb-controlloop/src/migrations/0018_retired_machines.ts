import { type Kysely, sql } from 'kysely';

/**
 * Retired machines, and the agent boot's scan of silent agents limited to
 * the machines whose BMC boots their agent. Adds to the schema and changes
 * nothing in it. Released: never edit, add a migration.
 *
 * - `machine_retired`: a machine decommissioned, by its provider and
 *   provider ID, with the machine ID it had, when, by whom, why, and whether
 *   its disks were wiped first. Its machine row is gone (with its tags, as
 *   before), so no loop, selection, gauge or total has to learn to skip it;
 *   this row is what the provisioner skips, so that a machine still in its
 *   provider's inventory is not brought back as a new machine. A table of
 *   its own rather than a retired machine row kept: every selection, count
 *   and trigger of the BMDB reads `machines` and its tags as the live fleet.
 *   It has no key on `machines`, like `work_history`: it outlives the row.
 * - `agent_boot` on `machine_agent_started` and `machine_agent_heartbeat`:
 *   whether the machine's BMC boots its agent (it has a `machine_agent_boot`
 *   row), kept by triggers as 0015's `machine_agent_pending.agent_boot` is.
 *   The agent boot finds its machines whose agent went silent through two
 *   partial indexes of those alone (`machine_agent_heartbeat_boot_idx` by
 *   heartbeat time, `machine_agent_started_boot_silent_idx` by start time,
 *   of agents that never heartbeated), so a fleet of SSH machines with
 *   silent agents costs it nothing. The heartbeat's flag is set by the
 *   trigger that runs when its row is inserted (once per agent), never by
 *   the heartbeats that update it: an upsert runs BEFORE INSERT triggers
 *   every time, AFTER INSERT ones only for a row inserted.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await createRetiredMachines(db);
  await flagBmcBootedAgents(db);
}

async function createRetiredMachines(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_retired (
      provider text NOT NULL,
      provider_id text NOT NULL,
      machine_id uuid NOT NULL,
      retired_at timestamptz NOT NULL DEFAULT now(),
      retired_by text,
      retire_reason text,
      wiped boolean NOT NULL,
      PRIMARY KEY (provider, provider_id)
    )`.execute(db);
  // The fleet page names a retired machine asked for by the machine ID it had.
  await sql`CREATE INDEX machine_retired_machine_idx ON machine_retired (machine_id)`.execute(db);
}

async function flagBmcBootedAgents(db: Kysely<unknown>): Promise<void> {
  for (const table of ['machine_agent_started', 'machine_agent_heartbeat']) {
    await sql`ALTER TABLE ${sql.table(table)} ADD COLUMN agent_boot boolean NOT NULL DEFAULT false`.execute(db);
    await sql`
      UPDATE ${sql.table(table)} t SET agent_boot = true
      WHERE EXISTS (SELECT 1 FROM machine_agent_boot ab WHERE ab.machine_id = t.machine_id)`.execute(db);
  }
  await sql`
    CREATE INDEX machine_agent_heartbeat_boot_idx ON machine_agent_heartbeat (agent_heartbeat_at)
    WHERE agent_boot`.execute(db);
  await sql`
    CREATE INDEX machine_agent_started_boot_silent_idx ON machine_agent_started (agent_started_at)
    WHERE agent_boot AND NOT has_heartbeat`.execute(db);

  // 0005's function, which an AgentStarted tag runs as it is inserted, also takes the boot method.
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_started_init() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.has_heartbeat := EXISTS (SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = NEW.machine_id);
      NEW.agent_boot := EXISTS (SELECT 1 FROM machine_agent_boot WHERE machine_id = NEW.machine_id);
      DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      RETURN NEW;
    END $$`.execute(db);
  // 0002's function, which a heartbeat row runs once inserted (not updated), also flags it.
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_heartbeat_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        UPDATE machine_agent_started SET has_heartbeat = true
        WHERE machine_id = NEW.machine_id AND NOT has_heartbeat;
        UPDATE machine_agent_heartbeat SET agent_boot = true
        WHERE machine_id = NEW.machine_id AND NOT agent_boot
          AND EXISTS (SELECT 1 FROM machine_agent_boot WHERE machine_id = NEW.machine_id);
      ELSE
        UPDATE machine_agent_started SET has_heartbeat = false
        WHERE machine_id = OLD.machine_id AND has_heartbeat;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  // A boot method set or removed flags the machine's agent tags; a change between two BMC methods changes nothing.
  await sql`
    CREATE FUNCTION bmdb_agent_boot_flags() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      machine uuid := CASE TG_OP WHEN 'INSERT' THEN NEW.machine_id ELSE OLD.machine_id END;
    BEGIN
      UPDATE machine_agent_started SET agent_boot = (TG_OP = 'INSERT')
      WHERE machine_id = machine AND agent_boot <> (TG_OP = 'INSERT');
      UPDATE machine_agent_heartbeat SET agent_boot = (TG_OP = 'INSERT')
      WHERE machine_id = machine AND agent_boot <> (TG_OP = 'INSERT');
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_boot_flags AFTER INSERT OR DELETE ON machine_agent_boot
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_boot_flags()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_agent_boot_flags ON machine_agent_boot`.execute(db);
  await sql`DROP FUNCTION bmdb_agent_boot_flags()`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_heartbeat_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        UPDATE machine_agent_started SET has_heartbeat = true
        WHERE machine_id = NEW.machine_id AND NOT has_heartbeat;
      ELSE
        UPDATE machine_agent_started SET has_heartbeat = false
        WHERE machine_id = OLD.machine_id AND has_heartbeat;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_started_init() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.has_heartbeat := EXISTS (SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = NEW.machine_id);
      DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      RETURN NEW;
    END $$`.execute(db);
  await sql`DROP INDEX machine_agent_started_boot_silent_idx`.execute(db);
  await sql`DROP INDEX machine_agent_heartbeat_boot_idx`.execute(db);
  for (const table of ['machine_agent_heartbeat', 'machine_agent_started']) {
    await sql`ALTER TABLE ${sql.table(table)} DROP COLUMN agent_boot`.execute(db);
  }
  await sql`DROP TABLE machine_retired`.execute(db);
}
