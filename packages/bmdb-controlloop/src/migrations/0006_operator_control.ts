import { type Kysely, sql } from 'kysely';

/**
 * What an operator's hands on the fleet need: holds, a record of what people
 * did to machines, and each machine's power state. Adds to the schema and
 * changes nothing in it. Released: never edit, add a migration.
 *
 * - `machine_hold`: a machine an operator is working on (reason, actor,
 *   since). Every selection the library builds leaves held machines out
 *   unless it opts in to them. Deleting a hold notifies
 *   `bmdb_machines_changed`, as a deleted backoff does: the machine may be
 *   eligible again.
 * - `operator_history`: what people did to machines: holds, unholds, power
 *   actions, with outcome, reason, actor and cause, and the action's
 *   particulars as JSON (`detail`). `action` is free text, so other
 *   components record their own operators' actions here (an OS installation
 *   requested or cancelled) instead of adding a table of their own. No key on
 *   `machines`, like `work_history`: it outlives a decommissioned machine.
 *   `operator_history_machine_idx` serves one machine's history, newest
 *   first.
 * - `machine_power_state`: the last power state read of each provided
 *   machine, with when it was read, or the last read's failure and cause.
 *   A trigger on `machine_provided` makes the row when a machine is provided
 *   and keeps its `provider` in step (the existing machines are backfilled),
 *   so the power sync finds the machines to read from an index without an
 *   anti-join over every machine: `machine_power_state_due_idx` serves the
 *   never-read (`power_checked_at IS NULL`) and the oldest-read machines of
 *   one provider as two range scans. `machine_power_state_state_idx` serves
 *   the fleet page's filter by power state and the counts of the rarer
 *   states (`On` is the rest); `machine_power_state_failed_idx` those whose
 *   last read failed.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machine_hold (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      hold_reason text NOT NULL,
      hold_actor text NOT NULL,
      held_at timestamptz NOT NULL DEFAULT now()
    )`.execute(db);
  // bmdb_notify_machine_changed() is 0005's.
  await sql`
    CREATE TRIGGER machine_hold_notify AFTER DELETE ON machine_hold
    FOR EACH ROW EXECUTE FUNCTION bmdb_notify_machine_changed()`.execute(db);

  await sql`
    CREATE TABLE operator_history (
      machine_id uuid NOT NULL,
      action text NOT NULL,
      outcome text NOT NULL CHECK (outcome IN ('Succeeded', 'Failed', 'Refused')),
      reason text,
      actor text NOT NULL,
      "timestamp" timestamptz NOT NULL DEFAULT now(),
      cause text,
      detail jsonb
    )`.execute(db);
  await sql`CREATE INDEX operator_history_machine_idx ON operator_history (machine_id, "timestamp")`.execute(db);

  await sql`
    CREATE TABLE machine_power_state (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      provider text NOT NULL,
      power_state text CHECK (power_state IN ('On', 'Off', 'PoweringOn', 'PoweringOff', 'Unknown')),
      power_state_read_at timestamptz,
      power_read_failed_at timestamptz,
      power_read_failed_cause text,
      power_checked_at timestamptz
    )`.execute(db);
  await sql`
    CREATE INDEX machine_power_state_due_idx ON machine_power_state (provider, power_checked_at)`.execute(db);
  await sql`
    CREATE INDEX machine_power_state_state_idx ON machine_power_state (power_state, machine_id)`.execute(db);
  await sql`
    CREATE INDEX machine_power_state_failed_idx ON machine_power_state (machine_id)
    WHERE power_read_failed_at IS NOT NULL`.execute(db);
  await sql`
    INSERT INTO machine_power_state (machine_id, provider)
    SELECT machine_id, provider FROM machine_provided`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_power_state_provided() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'DELETE' THEN
        DELETE FROM machine_power_state WHERE machine_id = OLD.machine_id;
      ELSE
        INSERT INTO machine_power_state (machine_id, provider) VALUES (NEW.machine_id, NEW.provider)
        ON CONFLICT (machine_id) DO UPDATE SET provider = excluded.provider;
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_provided_power_state AFTER INSERT OR DELETE OR UPDATE OF provider ON machine_provided
    FOR EACH ROW EXECUTE FUNCTION bmdb_power_state_provided()`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`DROP TRIGGER machine_provided_power_state ON machine_provided`.execute(db);
  await sql`DROP FUNCTION bmdb_power_state_provided()`.execute(db);
  await sql`DROP TABLE machine_power_state`.execute(db);
  await sql`DROP TABLE operator_history`.execute(db);
  await sql`DROP TABLE machine_hold`.execute(db);
}
