import { type Kysely, sql } from 'kysely';

/**
 * What the read-only fleet page (`@bmaas/web`) needs to answer every page from
 * indexes at 100,000 machines and millions of history rows. Adds to the
 * schema and changes nothing in it. Released: never edit, add a migration.
 *
 * - `sessions.processor`: which loop holds a session (`shepherd-initializer`),
 *   so the page can say which shepherds are alive and doing what. Null for
 *   sessions started before this migration.
 * - `work_history_failed_idx`: the fleet's most recent failures, newest
 *   first, without reading every machine's history.
 * - `machine_provided_provider_machine_idx`: the machines of one provider in
 *   machine ID order, for keyset pages filtered by provider.
 * - `machine_provided_provider_id_pattern_idx`: search by provider ID or its
 *   prefix across providers (`text_pattern_ops` serves `LIKE 'prefix%'`
 *   whatever the database's collation).
 * - `machine_unprovided`: the machines without a Provided tag, kept by
 *   triggers (a machine is inserted there, and leaves when provided). The
 *   stage counts need one count of all machines instead of two, and the
 *   machines awaiting a Provided tag are listed without an anti-join over
 *   every machine. Rows, not a counter: a counter row would serialize every
 *   transaction creating machines.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE sessions ADD COLUMN processor text`.execute(db);
  await sql`
    CREATE INDEX work_history_failed_idx ON work_history ("timestamp") WHERE event = 'Failed'`.execute(db);
  await sql`
    CREATE INDEX machine_provided_provider_machine_idx ON machine_provided (provider, machine_id)`.execute(db);
  await sql`
    CREATE INDEX machine_provided_provider_id_pattern_idx ON machine_provided (provider_id text_pattern_ops)`.execute(
    db,
  );

  await sql`
    CREATE TABLE machine_unprovided (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE
    )`.execute(db);
  await sql`
    INSERT INTO machine_unprovided (machine_id)
    SELECT m.machine_id FROM machines m
    WHERE NOT EXISTS (SELECT 1 FROM machine_provided mp WHERE mp.machine_id = m.machine_id)`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_unprovided_machine() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO machine_unprovided (machine_id) VALUES (NEW.machine_id) ON CONFLICT DO NOTHING;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machines_unprovided AFTER INSERT ON machines
    FOR EACH ROW EXECUTE FUNCTION bmdb_unprovided_machine()`.execute(db);
  // A Provided tag deleted with its machine finds no machine to put back.
  await sql`
    CREATE FUNCTION bmdb_unprovided_provided() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN
        DELETE FROM machine_unprovided WHERE machine_id = NEW.machine_id;
      ELSE
        INSERT INTO machine_unprovided (machine_id)
        SELECT machine_id FROM machines WHERE machine_id = OLD.machine_id
        ON CONFLICT DO NOTHING;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_unprovided AFTER INSERT OR DELETE ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION bmdb_unprovided_provided()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_provided_unprovided ON machine_provided`.execute(db);
  await sql`DROP TRIGGER machines_unprovided ON machines`.execute(db);
  await sql`DROP FUNCTION bmdb_unprovided_provided()`.execute(db);
  await sql`DROP FUNCTION bmdb_unprovided_machine()`.execute(db);
  await sql`DROP TABLE machine_unprovided`.execute(db);
  await sql`DROP INDEX machine_provided_provider_id_pattern_idx`.execute(db);
  await sql`DROP INDEX machine_provided_provider_machine_idx`.execute(db);
  await sql`DROP INDEX work_history_failed_idx`.execute(db);
  await sql`ALTER TABLE sessions DROP COLUMN processor`.execute(db);
}
