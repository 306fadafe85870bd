import { type Kysely, sql } from 'kysely';

/**
 * How a machine's agent arrives (its boot method): over SSH, by a takeover
 * (the default), or booted by the machine's BMC from virtual media or the
 * network. Released: never edit, add a migration.
 *
 * - `machine_agent_boot`: one row per machine whose BMC boots its agent, with
 *   the method (`virtual-media`, `network`); no row means SSH. Written by
 *   `setAgentBootMethods` from the provider's inventory, so a fleet of SSH
 *   machines has no rows here.
 * - `machine_agent_pending.agent_boot`: whether the pending machine's BMC
 *   boots its agent (it has a `machine_agent_boot` row), kept by triggers. The
 *   SSH initializer and the agent boot read the pending machines of a
 *   provider through one partial index each (`machine_agent_pending_ssh_idx`,
 *   `machine_agent_pending_boot_idx`, replacing 0002's
 *   `machine_agent_pending_provider_idx`), so neither walks past the other's
 *   machines: a fleet of blank machines waiting for their BMC costs the
 *   initializer nothing, and the reverse.
 * - A machine switching between SSH and a BMC boot while pending notifies
 *   `bmdb_machines_changed`, as 0002's triggers do, since it became eligible
 *   for the other loop.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_agent_boot (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      boot_method text NOT NULL CHECK (boot_method IN ('virtual-media', 'network'))
    )`.execute(db);

  await sql`ALTER TABLE machine_agent_pending ADD COLUMN agent_boot boolean NOT NULL DEFAULT false`.execute(db);
  await sql`
    CREATE INDEX machine_agent_pending_ssh_idx ON machine_agent_pending (provider, machine_id)
    WHERE NOT agent_boot`.execute(db);
  await sql`
    CREATE INDEX machine_agent_pending_boot_idx ON machine_agent_pending (provider, machine_id)
    WHERE agent_boot`.execute(db);
  await sql`DROP INDEX machine_agent_pending_provider_idx`.execute(db);

  // Whoever inserts a pending row (0009's triggers), it takes the machine's
  // boot method as it is.
  await sql`
    CREATE FUNCTION bmdb_agent_pending_boot() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.agent_boot := EXISTS (SELECT 1 FROM machine_agent_boot WHERE machine_id = NEW.machine_id);
      RETURN NEW;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_pending_boot BEFORE INSERT ON machine_agent_pending
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_boot()`.execute(db);

  // A boot method set or removed moves its pending machine between the
  // loops; a change between two BMC methods moves nothing.
  await sql`
    CREATE FUNCTION bmdb_agent_boot_pending() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE machine_agent_pending SET agent_boot = (TG_OP = 'INSERT')
      WHERE machine_id = CASE TG_OP WHEN 'INSERT' THEN NEW.machine_id ELSE OLD.machine_id END
        AND agent_boot <> (TG_OP = 'INSERT');
      IF FOUND THEN
        PERFORM pg_notify('bmdb_machines_changed', TG_TABLE_NAME);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_boot_pending AFTER INSERT OR DELETE ON machine_agent_boot
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_boot_pending()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_agent_boot_pending ON machine_agent_boot`.execute(db);
  await sql`DROP FUNCTION bmdb_agent_boot_pending()`.execute(db);
  await sql`DROP TRIGGER machine_agent_pending_boot ON machine_agent_pending`.execute(db);
  await sql`DROP FUNCTION bmdb_agent_pending_boot()`.execute(db);
  await sql`CREATE INDEX machine_agent_pending_provider_idx ON machine_agent_pending (provider, machine_id)`.execute(
    db,
  );
  await sql`DROP INDEX machine_agent_pending_boot_idx`.execute(db);
  await sql`DROP INDEX machine_agent_pending_ssh_idx`.execute(db);
  await sql`ALTER TABLE machine_agent_pending DROP COLUMN agent_boot`.execute(db);
  await sql`DROP TABLE machine_agent_boot`.execute(db);
}
