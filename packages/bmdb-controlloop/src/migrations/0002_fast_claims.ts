import { type Kysely, sql } from 'kysely';

/**
 * What one-statement claims, index-only selections and notified idle workers
 * need. Adds to the schema of 0001 and changes nothing in it. Released: never
 * edit, add a migration.
 *
 * - `machines.claim_version`: bumped by every claim. A claim locks the
 *   machine row and re-checks the version it selected by, so a machine
 *   claimed by anyone since the claim's snapshot is skipped (see sql/claim-parts.ts and sql/claim-selected.ts).
 * - `machine_agent_pending`: the provided machines without an AgentStarted
 *   tag, by provider, kept by triggers. The agent-start selection reads it
 *   instead of anti-joining every provided machine with AgentStarted, which
 *   at 100,000 machines, nearly all started, scans them all. A table rather
 *   than a flag column: finishing a start deletes a row (which concurrent
 *   SERIALIZABLE finishes do not conflict on) instead of updating an
 *   indexed column of machine_provided (whose new index entries they do).
 * - `machine_agent_started.has_heartbeat`: a trigger-kept mirror of "an
 *   AgentHeartbeat row exists" (it changes once per agent), so the partial
 *   index on agents that never heartbeated holds just those.
 * - Notifications on channel `bmdb_machines_changed` when a machine may have
 *   become eligible (provided, agent stopped, heartbeat or backoff removed),
 *   so idle control loops wake at once instead of at their next poll.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`ALTER TABLE machines ADD COLUMN claim_version bigint NOT NULL DEFAULT 0`.execute(db);

  await sql`
    CREATE TABLE machine_agent_pending (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      provider text NOT NULL
    )`.execute(db);
  await sql`CREATE INDEX machine_agent_pending_provider_idx ON machine_agent_pending (provider, machine_id)`.execute(
    db,
  );
  await sql`
    INSERT INTO machine_agent_pending (machine_id, provider)
    SELECT mp.machine_id, mp.provider FROM machine_provided mp
    WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = mp.machine_id)`.execute(db);
  await sql`ALTER TABLE machine_agent_started ADD COLUMN has_heartbeat boolean NOT NULL DEFAULT false`.execute(db);
  await sql`
    UPDATE machine_agent_started a SET has_heartbeat = true
    WHERE EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = a.machine_id)`.execute(db);

  // machine_agent_pending follows the Provided and AgentStarted tags.
  await sql`
    CREATE FUNCTION bmdb_agent_pending_provided() RETURNS trigger LANGUAGE plpgsql AS $$
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
    CREATE TRIGGER machine_provided_agent_pending AFTER INSERT OR DELETE OR UPDATE OF machine_id, provider
    ON machine_provided FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_provided()`.execute(db);
  await sql`
    CREATE FUNCTION bmdb_agent_pending_started() RETURNS trigger LANGUAGE plpgsql AS $$
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
  await sql`
    CREATE TRIGGER machine_agent_started_pending AFTER INSERT OR DELETE ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_pending_started()`.execute(db);

  await sql`
    CREATE FUNCTION bmdb_agent_started_init() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      NEW.has_heartbeat := EXISTS (SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = NEW.machine_id);
      RETURN NEW;
    END $$`.execute(db);
  await sql`
    CREATE TRIGGER machine_agent_started_init BEFORE INSERT ON machine_agent_started
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_started_init()`.execute(db);

  // The heartbeat mirror follows inserts and deletes of heartbeats.
  await sql`
    CREATE FUNCTION bmdb_agent_heartbeat_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
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
    CREATE TRIGGER machine_agent_heartbeat_mirror AFTER INSERT OR DELETE ON machine_agent_heartbeat
    FOR EACH ROW EXECUTE FUNCTION bmdb_agent_heartbeat_mirror()`.execute(db);

  // Recovery: agents that never heartbeated, by start time (stale heartbeats
  // use machine_agent_heartbeat_at_idx of 0001).
  await sql`
    CREATE INDEX machine_agent_started_silent_idx ON machine_agent_started (agent_started_at)
    WHERE NOT has_heartbeat`.execute(db);

  // A release that finds no claim to release raises, so that it can open a
  // transaction in the same round trip as its BEGIN (whose result nobody reads).
  await sql`
    CREATE FUNCTION bmdb_work_lost(machine_id uuid, process text, session_id uuid) RETURNS boolean
    LANGUAGE plpgsql AS $$
    BEGIN
      RAISE EXCEPTION 'work on machine % for process % is no longer held by session %',
        machine_id, process, session_id USING ERRCODE = 'BMW01';
    END $$`.execute(db);

  // Wake-ups. One notification per statement that changed rows; PostgreSQL
  // folds identical notifications of a transaction into one. Claims, finishes
  // and failures never notify: they make machines ineligible, not eligible.
  await sql`
    CREATE FUNCTION bmdb_notify_machines_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM changed) THEN
        PERFORM pg_notify('bmdb_machines_changed', TG_TABLE_NAME);
      END IF;
      RETURN NULL;
    END $$`.execute(db);
  for (const [table, event, transition] of [
    ['machine_provided', 'INSERT', 'NEW'],
    ['machine_agent_started', 'DELETE', 'OLD'],
    ['machine_agent_heartbeat', 'DELETE', 'OLD'],
    ['work_backoff', 'DELETE', 'OLD'],
  ] as const) {
    await sql`
      CREATE TRIGGER ${sql.id(`${table}_notify`)} AFTER ${sql.raw(event)} ON ${sql.table(table)}
      REFERENCING ${sql.raw(transition)} TABLE AS changed
      FOR EACH STATEMENT EXECUTE FUNCTION bmdb_notify_machines_changed()`.execute(db);
  }
}

export async function down(db: Kysely<unknown>): Promise<void> {
  for (const table of ['machine_provided', 'machine_agent_started', 'machine_agent_heartbeat', 'work_backoff']) {
    await sql`DROP TRIGGER IF EXISTS ${sql.id(`${table}_notify`)} ON ${sql.table(table)}`.execute(db);
  }
  await sql`DROP TRIGGER machine_agent_heartbeat_mirror ON machine_agent_heartbeat`.execute(db);
  await sql`DROP TRIGGER machine_agent_started_init ON machine_agent_started`.execute(db);
  await sql`DROP TRIGGER machine_agent_started_pending ON machine_agent_started`.execute(db);
  await sql`DROP TRIGGER machine_provided_agent_pending ON machine_provided`.execute(db);
  await sql`DROP FUNCTION bmdb_work_lost(uuid, text, uuid)`.execute(db);
  for (const fn of [
    'bmdb_notify_machines_changed',
    'bmdb_agent_heartbeat_mirror',
    'bmdb_agent_started_init',
    'bmdb_agent_pending_started',
    'bmdb_agent_pending_provided',
  ]) {
    await sql`DROP FUNCTION ${sql.id(fn)}()`.execute(db);
  }
  await sql`DROP INDEX machine_agent_started_silent_idx`.execute(db);
  await sql`ALTER TABLE machine_agent_started DROP COLUMN has_heartbeat`.execute(db);
  await sql`DROP TABLE machine_agent_pending`.execute(db);
  await sql`ALTER TABLE machines DROP COLUMN claim_version`.execute(db);
}
