import { type Kysely, sql } from 'kysely';

/**
 * The BMDB schema: machines, their tags, sessions and work. Released: never edit, add a migration.
 *
 * Tag tables cascade from `machines`. `work.machine_id` deliberately does not:
 * a machine under a live claim cannot be deleted from under its worker.
 */
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    CREATE TABLE machines (
      machine_id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
      machine_created_at timestamptz NOT NULL DEFAULT now()
    )`.execute(db);

  await sql`
    CREATE TABLE machine_provided (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      provider text NOT NULL,
      provider_id text NOT NULL,
      provider_reservation_id text,
      provider_ip_address text,
      provider_location text,
      provider_status text CHECK (provider_status IN (
        'Missing', 'Provisioning', 'ProvisioningFailedPermanent', 'Running', 'Stopped', 'Unknown'
      )),
      CONSTRAINT machine_provided_provider_id_key UNIQUE (provider, provider_id)
    )`.execute(db);

  await sql`
    CREATE TABLE machine_agent_started (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      agent_started_at timestamptz NOT NULL,
      agent_public_key bytea NOT NULL
    )`.execute(db);

  await sql`
    CREATE TABLE machine_agent_heartbeat (
      machine_id uuid NOT NULL PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
      agent_heartbeat_at timestamptz NOT NULL
    )`.execute(db);

  await sql`
    CREATE TABLE sessions (
      session_id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
      component_name text NOT NULL,
      runtime_info text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      interval_seconds integer NOT NULL CHECK (interval_seconds > 0),
      deadline timestamptz NOT NULL
    )`.execute(db);
  // The collector looks for sessions whose deadline passed.
  await sql`CREATE INDEX sessions_deadline_idx ON sessions (deadline)`.execute(db);

  await sql`
    CREATE TABLE work (
      machine_id uuid NOT NULL REFERENCES machines (machine_id),
      session_id uuid NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
      process text NOT NULL,
      CONSTRAINT work_machine_process_key UNIQUE (machine_id, process)
    )`.execute(db);
  // Closing or collecting a session releases its work by session.
  await sql`CREATE INDEX work_session_idx ON work (session_id)`.execute(db);

  await sql`
    CREATE TABLE work_history (
      machine_id uuid NOT NULL,
      process text NOT NULL,
      event text NOT NULL CHECK (event IN ('Started', 'Finished', 'Failed', 'Canceled')),
      timestamp timestamptz NOT NULL,
      failed_cause text
    )`.execute(db);
  await sql`CREATE INDEX work_history_machine_idx ON work_history (machine_id, timestamp)`.execute(db);

  await sql`
    CREATE TABLE work_backoff (
      machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
      process text NOT NULL,
      until timestamptz NOT NULL,
      cause text NOT NULL,
      last_interval_seconds integer,
      CONSTRAINT work_backoff_machine_process_key UNIQUE (machine_id, process)
    )`.execute(db);
  // Fleet status lists running backoffs per process.
  await sql`CREATE INDEX work_backoff_process_until_idx ON work_backoff (process, until)`.execute(db);

  // Recovery looks for agents started long ago or heartbeats gone stale.
  await sql`CREATE INDEX machine_agent_started_at_idx ON machine_agent_started (agent_started_at)`.execute(db);
  await sql`CREATE INDEX machine_agent_heartbeat_at_idx ON machine_agent_heartbeat (agent_heartbeat_at)`.execute(db);
}

export async function down(db: Kysely<unknown>): Promise<void> {
  for (const table of [
    'work_backoff',
    'work_history',
    'work',
    'sessions',
    'machine_agent_heartbeat',
    'machine_agent_started',
    'machine_provided',
    'machines',
  ]) {
    await sql`DROP TABLE ${sql.table(table)}`.execute(db);
  }
}
