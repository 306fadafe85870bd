import { type Kysely, sql } from 'kysely';

/**
 * Fewer trigger calls per finished work item, for the same results.
 * Released: never edit, add a migration.
 *
 * - The wake-up notifications for deleted backoffs, AgentStarted and
 *   AgentHeartbeat tags (0002) become row triggers. As statement triggers
 *   with transition tables they ran for every statement that could delete,
 *   rows or not: a finish, whose statement clears the pair's backoff if
 *   there is one, paid for a trigger call and its transition table every
 *   time. A row trigger runs only for a row deleted; PostgreSQL folds the
 *   identical notifications of a transaction into one, as before.
 * - Setting AgentStarted takes one trigger call instead of two: the BEFORE
 *   INSERT trigger that mirrors the heartbeat (0002) also takes the machine
 *   out of `machine_agent_pending`, which the AFTER INSERT trigger did. Where
 *   the insert meets an existing tag (ON CONFLICT), the machine was started
 *   already and is not pending; where the statement fails, its delete is
 *   undone with it.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE FUNCTION bmdb_notify_machine_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM pg_notify('bmdb_machines_changed', TG_TABLE_NAME);
      RETURN NULL;
    END $$`.execute(db);
  for (const table of ['machine_agent_started', 'machine_agent_heartbeat', 'work_backoff']) {
    await sql`DROP TRIGGER ${sql.id(`${table}_notify`)} ON ${sql.table(table)}`.execute(db);
    await sql`
      CREATE TRIGGER ${sql.id(`${table}_notify`)} AFTER DELETE ON ${sql.table(table)}
      FOR EACH ROW EXECUTE FUNCTION bmdb_notify_machine_changed()`.execute(db);
  }

  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_started_init() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.has_heartbeat := EXISTS (SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = NEW.machine_id);
      DELETE FROM machine_agent_pending WHERE machine_id = NEW.machine_id;
      RETURN NEW;
    END $$`.execute(db);
  await sql`DROP TRIGGER machine_agent_started_pending ON machine_agent_started`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_started_pending AFTER DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_started()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_agent_started_pending ON machine_agent_started`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_started_pending AFTER INSERT OR DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_started()`.execute(db);
  await sql`
    CREATE OR REPLACE FUNCTION bmdb_agent_started_init() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.has_heartbeat := EXISTS (SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = NEW.machine_id);
      RETURN NEW;
    END $$`.execute(db);

  for (const table of ['machine_agent_started', 'machine_agent_heartbeat', 'work_backoff']) {
    await sql`DROP TRIGGER ${sql.id(`${table}_notify`)} ON ${sql.table(table)}`.execute(db);
    await sql`
      CREATE TRIGGER ${sql.id(`${table}_notify`)} AFTER DELETE ON ${sql.table(table)}
      REFERENCING OLD TABLE AS changed
      FOR EACH STATEMENT EXECUTE FUNCTION bmdb_notify_machines_changed()`.execute(db);
  }
  await sql`DROP FUNCTION bmdb_notify_machine_changed()`.execute(db);
}
