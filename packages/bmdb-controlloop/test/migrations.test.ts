import { Kysely, Migrator, PostgresDialect } from 'kysely';
import pg from 'pg';
import { expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import * as initial from '../src/migrations/0001_initial.js';

test('migrations create the schema once; running them again is a no-op', async () => {
  const db = await createTestDatabase();
  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual([
    '0001_initial',
    '0002_fast_claims',
    '0003_agent_reports',
    '0004_fleet_page',
    '0005_lean_triggers',
    '0006_operator_control',
    '0007_os_installation',
  ]);
  expect(await bmdb.migrate()).toEqual([]);
  // Concurrent starts migrate safely too.
  const [a, b] = await Promise.all([openTestBMDB(db), openTestBMDB(db)]);
  expect(await a.migrate()).toEqual([]);
  expect(await b.migrate()).toEqual([]);

  const { rows } = await db.admin(`
    SELECT table_name, array_agg(column_name::text ORDER BY ordinal_position) AS columns
    FROM information_schema.columns WHERE table_schema = 'public' AND table_name NOT LIKE 'bmdb_migration%'
    GROUP BY table_name ORDER BY table_name`);
  expect(Object.fromEntries(rows.map((r) => [r.table_name, r.columns]))).toEqual({
    machine_agent_heartbeat: ['machine_id', 'agent_heartbeat_at'],
    machine_agent_started: ['machine_id', 'agent_started_at', 'agent_public_key', 'has_heartbeat'],
    machine_provided: [
      'machine_id',
      'provider',
      'provider_id',
      'provider_reservation_id',
      'provider_ip_address',
      'provider_location',
      'provider_status',
    ],
    machine_agent_pending: ['machine_id', 'provider'],
    machine_hardware_report: ['machine_id', 'hardware_report_raw', 'hardware_reported_at'],
    machine_os_installation_report: [
      'machine_id',
      'generation',
      'os_installation_result',
      'os_installation_report_raw',
      'os_installation_reported_at',
    ],
    machine_os_installation_request: [
      'machine_id',
      'generation',
      'image_url',
      'image_sha256',
      'root_device',
      'compression',
      'user_data',
      'requested_at',
      'requested_by',
      'installation_state',
      'delivered_at',
      'installation_ended_at',
      'installation_error',
    ],
    machine_unprovided: ['machine_id'],
    machine_hold: ['machine_id', 'hold_reason', 'hold_actor', 'held_at'],
    machine_power_state: [
      'machine_id',
      'provider',
      'power_state',
      'power_state_read_at',
      'power_read_failed_at',
      'power_read_failed_cause',
      'power_checked_at',
    ],
    operator_history: ['machine_id', 'action', 'outcome', 'reason', 'actor', 'timestamp', 'cause', 'detail'],
    machines: ['machine_id', 'machine_created_at', 'claim_version'],
    sessions: [
      'session_id',
      'component_name',
      'runtime_info',
      'created_at',
      'interval_seconds',
      'deadline',
      'processor',
    ],
    work: ['machine_id', 'session_id', 'process'],
    work_backoff: ['machine_id', 'process', 'until', 'cause', 'last_interval_seconds'],
    work_history: ['machine_id', 'process', 'event', 'timestamp', 'failed_cause'],
  });

  const indexes = await db.admin(`SELECT indexname FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname`);
  expect(indexes.rows.map((r) => r.indexname)).toEqual(
    expect.arrayContaining([
      'machine_provided_provider_id_key',
      'work_machine_process_key',
      'work_session_idx',
      'work_backoff_machine_process_key',
      'work_history_machine_idx',
      'sessions_deadline_idx',
      'machine_agent_pending_provider_idx',
      'machine_agent_started_silent_idx',
      'work_history_failed_idx',
      'machine_provided_provider_machine_idx',
      'machine_provided_provider_id_pattern_idx',
      'operator_history_machine_idx',
      'machine_power_state_due_idx',
      'machine_power_state_state_idx',
      'machine_power_state_failed_idx',
    ]),
  );

  // Deleting a session releases its work; deleting a machine under live work is refused.
  const session = await bmdb.startSession();
  const machineId = await session.transact((q) => q.newMachine());
  await session.work('Anything', async () => [machineId]);
  await expect(db.admin('DELETE FROM machines WHERE machine_id = $1', [machineId])).rejects.toThrow(/foreign key/);
  await db.admin('DELETE FROM sessions WHERE session_id = $1', [session.id]);
  expect((await db.admin('SELECT count(*)::int AS n FROM work')).rows[0].n).toBe(0);
});

test('0002 on a database with data: pending agents and heartbeat mirrors are backfilled, then kept by triggers', async () => {
  const db = await createTestDatabase();
  // A deployment that ran 0001 only, with a started agent and a heartbeat.
  const released = new Kysely<unknown>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: db.url }) }),
  });
  const { error } = await new Migrator({
    db: released,
    provider: { getMigrations: async () => ({ '0001_initial': initial }) },
    migrationTableName: 'bmdb_migration',
    migrationLockTableName: 'bmdb_migration_lock',
  }).migrateToLatest();
  await released.destroy();
  expect(error).toBeUndefined();
  const [started, heartbeating, fresh] = ['a', 'b', 'c'];
  for (const name of [started, heartbeating, fresh]) {
    await db.admin(
      `WITH m AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id)
       INSERT INTO machine_provided (machine_id, provider, provider_id) SELECT machine_id, 'Old', $1 FROM m`,
      [name],
    );
  }
  const id = async (name: string) =>
    (await db.admin('SELECT machine_id FROM machine_provided WHERE provider_id = $1', [name])).rows[0]
      .machine_id as string;
  for (const name of [started, heartbeating]) {
    await db.admin(`INSERT INTO machine_agent_started VALUES ($1, now(), '\\x00')`, [await id(name)]);
  }
  await db.admin('INSERT INTO machine_agent_heartbeat VALUES ($1, now())', [await id(heartbeating)]);
  const unprovided = (await db.admin('INSERT INTO machines DEFAULT VALUES RETURNING machine_id')).rows[0].machine_id;

  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual([
    '0002_fast_claims',
    '0003_agent_reports',
    '0004_fleet_page',
    '0005_lean_triggers',
    '0006_operator_control',
    '0007_os_installation',
  ]);
  expect(await bmdb.migrate()).toEqual([]);
  // 0006 backfills a power state row for each provided machine.
  expect((await db.admin('SELECT provider, power_state FROM machine_power_state')).rows).toEqual([
    { provider: 'Old', power_state: null },
    { provider: 'Old', power_state: null },
    { provider: 'Old', power_state: null },
  ]);
  // 0004 backfills the machines without a Provided tag.
  expect((await db.admin('SELECT machine_id FROM machine_unprovided')).rows).toEqual([{ machine_id: unprovided }]);
  const mirrors = async () =>
    (
      await db.admin(`
        SELECT mp.provider_id, p.provider IS NOT NULL AS pending, a.has_heartbeat FROM machine_provided mp
        LEFT JOIN machine_agent_pending p USING (machine_id)
        LEFT JOIN machine_agent_started a USING (machine_id) ORDER BY mp.provider_id`)
    ).rows;
  expect(await mirrors()).toEqual([
    { provider_id: 'a', pending: false, has_heartbeat: false },
    { provider_id: 'b', pending: false, has_heartbeat: true },
    { provider_id: 'c', pending: true, has_heartbeat: null },
  ]);

  const session = await bmdb.startSession();
  await session.transact(async (q) => {
    await q.setAgentStarted(await id(fresh), { publicKey: new Uint8Array(32) });
    await q.setAgentHeartbeat(await id(started));
    await q.deleteAgentHeartbeat(await id(heartbeating));
  });
  expect(await mirrors()).toEqual([
    { provider_id: 'a', pending: false, has_heartbeat: true },
    { provider_id: 'b', pending: false, has_heartbeat: false },
    { provider_id: 'c', pending: false, has_heartbeat: false },
  ]);
  await session.transact(async (q) => {
    await q.deleteAgentStarted(await id(started));
    await q.setAgentHeartbeat(await id(heartbeating));
  });
  expect(await mirrors()).toEqual([
    { provider_id: 'a', pending: true, has_heartbeat: null },
    { provider_id: 'b', pending: false, has_heartbeat: true },
    { provider_id: 'c', pending: false, has_heartbeat: false },
  ]);
  // A Provided tag added after the agent started is not pending; one removed is pending no more.
  const late = await session.transact(async (q) => {
    const machineId = await q.newMachine();
    await q.setAgentStarted(machineId, { publicKey: new Uint8Array(32) });
    await q.addProvided(machineId, { provider: 'Old', providerId: 'late' });
    return machineId;
  });
  const pending = async (machineId: string) =>
    (await db.admin('SELECT 1 FROM machine_agent_pending WHERE machine_id = $1', [machineId])).rowCount;
  expect(await pending(late)).toBe(0);
  const fresh2 = await id(fresh);
  await session.transact((q) => q.deleteAgentStarted(fresh2));
  expect(await pending(fresh2)).toBe(1);
  await db.admin('DELETE FROM machine_provided WHERE machine_id = $1', [fresh2]);
  expect(await pending(fresh2)).toBe(0);
  await session.close();
});
