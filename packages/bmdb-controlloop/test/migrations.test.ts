import { expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';

test('migrations create the schema once; running them again is a no-op', async () => {
  const db = await createTestDatabase();
  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual(['0001_initial']);
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
    machine_agent_started: ['machine_id', 'agent_started_at', 'agent_public_key'],
    machine_provided: [
      'machine_id',
      'provider',
      'provider_id',
      'provider_reservation_id',
      'provider_ip_address',
      'provider_location',
      'provider_status',
    ],
    machines: ['machine_id', 'machine_created_at'],
    sessions: ['session_id', 'component_name', 'runtime_info', 'created_at', 'interval_seconds', 'deadline'],
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
