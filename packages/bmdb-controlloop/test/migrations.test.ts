import {
  addProvided,
  controlByLocation,
  deleteAgentHeartbeat,
  deleteAgentStarted,
  fleetStagesByLocation,
  hardwareByLocation,
  newMachine,
  requestDiskWipe,
  requestOSInstallation,
  setAgentHeartbeat,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { Kysely, type Migration, Migrator, PostgresDialect } from 'kysely';
import pg from 'pg';
import { expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, type TestDatabase } from '../../../test/support/database.js';
import * as initial from '../src/migrations/0001_initial.js';
import * as fastClaims from '../src/migrations/0002_fast_claims.js';
import * as agentReports from '../src/migrations/0003_agent_reports.js';
import * as fleetPage from '../src/migrations/0004_fleet_page.js';
import * as leanTriggers from '../src/migrations/0005_lean_triggers.js';
import * as operatorControl from '../src/migrations/0006_operator_control.js';
import * as fleetMetrics from '../src/migrations/0008_fleet_metrics.js';
import * as osInstallation from '../src/migrations/0009_os_installation.js';
import * as installationReportKey from '../src/migrations/0010_installation_report_key.js';
import * as rootDeviceHints from '../src/migrations/0011_root_device_hints.js';
import * as diskWipe from '../src/migrations/0012_disk_wipe.js';
import * as agentLog from '../src/migrations/0013_agent_log.js';
import * as agentEnrollment from '../src/migrations/0014_agent_enrollment.js';
import * as agentBootMethod from '../src/migrations/0015_agent_boot_method.js';

/** The library's migrations as released up to 0006 (operator control). */
const THROUGH_0006: Record<string, Migration> = {
  '0001_initial': initial,
  '0002_fast_claims': fastClaims,
  '0003_agent_reports': agentReports,
  '0004_fleet_page': fleetPage,
  '0005_lean_triggers': leanTriggers,
  '0006_operator_control': operatorControl,
};

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
    '0008_fleet_metrics',
    '0009_os_installation',
    '0010_installation_report_key',
    '0011_root_device_hints',
    '0012_disk_wipe',
    '0013_agent_log',
    '0014_agent_enrollment',
    '0015_agent_boot_method',
    '0016_network_boot',
    '0018_retired_machines',
    '0019_first_boot',
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
    machine_agent_enrollment: ['machine_id', 'token_sha256', 'issued_at', 'expires_at', 'enrolled_at', 'boot_id'],
    machine_network_boot: [
      'machine_id',
      'boot_id',
      'session_id',
      'capability',
      'macs',
      'takeover_init',
      'agent_flags',
      'token_valid_seconds',
      'armed_at',
      'ended_at',
      'config_served_at',
      'config_served_to',
      'config_refused_at',
      'config_refused_to',
    ],
    machine_agent_boot: ['machine_id', 'boot_method'],
    machine_agent_heartbeat: ['machine_id', 'agent_heartbeat_at', 'agent_boot'],
    machine_agent_log: ['machine_id', 'agent_log', 'agent_log_received_at'],
    machine_agent_started: ['machine_id', 'agent_started_at', 'agent_public_key', 'has_heartbeat', 'agent_boot'],
    machine_retired: ['provider', 'provider_id', 'machine_id', 'retired_at', 'retired_by', 'retire_reason', 'wiped'],
    machine_provided: [
      'machine_id',
      'provider',
      'provider_id',
      'provider_reservation_id',
      'provider_ip_address',
      'provider_location',
      'provider_status',
    ],
    machine_agent_pending: ['machine_id', 'provider', 'agent_boot'],
    machine_hardware_report: [
      'machine_id',
      'hardware_report_raw',
      'hardware_reported_at',
      'provider',
      'provider_location',
      'cpu_threads',
      'memory_bytes',
      'disks',
      'disk_bytes',
    ],
    fleet_location_totals: [
      'provider',
      'provider_location',
      'shard',
      'machines',
      'reported_machines',
      'cpu_threads',
      'memory_bytes',
      'disks',
      'disk_bytes',
      'held',
      'power_on',
      'power_off',
      'powering_on',
      'powering_off',
      'power_unknown',
      'power_unread',
      'power_read_failed',
      'installed',
    ],
    machine_os_installation_report: [
      'machine_id',
      'generation',
      'os_installation_result',
      'os_installation_report_raw',
      'os_installation_reported_at',
      'agent_public_key',
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
      'provider',
      'provider_location',
      'root_device_hints',
      'request_kind',
      'decommission',
      'hostname',
      'ssh_public_keys',
      'network',
      'boot_secret_sha256',
      'booted_at',
      'booted_host_keys',
    ],
    machine_unprovided: ['machine_id'],
    machine_hold: ['machine_id', 'hold_reason', 'hold_actor', 'held_at', 'provider', 'provider_location'],
    machine_power_state: [
      'machine_id',
      'provider',
      'power_state',
      'power_state_read_at',
      'power_read_failed_at',
      'power_read_failed_cause',
      'power_checked_at',
      'provider_location',
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
      'machine_agent_pending_ssh_idx',
      'machine_agent_pending_boot_idx',
      'machine_agent_started_silent_idx',
      'work_history_failed_idx',
      'machine_provided_provider_machine_idx',
      'machine_provided_provider_id_pattern_idx',
      'operator_history_machine_idx',
      'machine_power_state_due_idx',
      'machine_power_state_state_idx',
      'machine_power_state_failed_idx',
      'fleet_location_totals_pkey',
      'machine_agent_heartbeat_boot_idx',
      'machine_agent_started_boot_silent_idx',
      'machine_retired_pkey',
      'machine_retired_machine_idx',
    ]),
  );
  // 0015 split it into the SSH machines' and the BMC-booted machines' partial indexes.
  expect(indexes.rows.map((r) => r.indexname)).not.toContain('machine_agent_pending_provider_idx');

  // Deleting a session releases its work; deleting a machine under live work is refused.
  const session = await bmdb.startSession();
  const machineId = await session.transact((q) => newMachine(q));
  await session.work('Anything', async () => [machineId]);
  await expect(db.admin('DELETE FROM machines WHERE machine_id = $1', [machineId])).rejects.toThrow(/foreign key/);
  await db.admin('DELETE FROM sessions WHERE session_id = $1', [session.id]);
  expect((await db.admin('SELECT count(*)::int AS n FROM work')).rows[0].n).toBe(0);
});

test('0002 on a database with data: pending agents and heartbeat mirrors are backfilled, then kept by triggers', async () => {
  const db = await createTestDatabase();
  // A deployment that ran 0001 only, with a started agent and a heartbeat.
  await migrateTo(db, { '0001_initial': initial });
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
    '0008_fleet_metrics',
    '0009_os_installation',
    '0010_installation_report_key',
    '0011_root_device_hints',
    '0012_disk_wipe',
    '0013_agent_log',
    '0014_agent_enrollment',
    '0015_agent_boot_method',
    '0016_network_boot',
    '0018_retired_machines',
    '0019_first_boot',
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
    await setAgentStarted(q, await id(fresh), { publicKey: new Uint8Array(32) });
    await setAgentHeartbeat(q, await id(started));
    await deleteAgentHeartbeat(q, await id(heartbeating));
  });
  expect(await mirrors()).toEqual([
    { provider_id: 'a', pending: false, has_heartbeat: true },
    { provider_id: 'b', pending: false, has_heartbeat: false },
    { provider_id: 'c', pending: false, has_heartbeat: false },
  ]);
  await session.transact(async (q) => {
    await deleteAgentStarted(q, await id(started));
    await setAgentHeartbeat(q, await id(heartbeating));
  });
  expect(await mirrors()).toEqual([
    { provider_id: 'a', pending: true, has_heartbeat: null },
    { provider_id: 'b', pending: false, has_heartbeat: true },
    { provider_id: 'c', pending: false, has_heartbeat: false },
  ]);
  // A Provided tag added after the agent started is not pending; one removed is pending no more.
  const late = await session.transact(async (q) => {
    const machineId = await newMachine(q);
    await setAgentStarted(q, machineId, { publicKey: new Uint8Array(32) });
    await addProvided(q, machineId, { provider: 'Old', providerId: 'late' });
    return machineId;
  });
  const pending = async (machineId: string) =>
    (await db.admin('SELECT 1 FROM machine_agent_pending WHERE machine_id = $1', [machineId])).rowCount;
  expect(await pending(late)).toBe(0);
  const fresh2 = await id(fresh);
  await session.transact((q) => deleteAgentStarted(q, fresh2));
  expect(await pending(fresh2)).toBe(1);
  await db.admin('DELETE FROM machine_provided WHERE machine_id = $1', [fresh2]);
  expect(await pending(fresh2)).toBe(0);
  await session.close();
});

test('0008 on a database with reports: the stored reports are read and the fleet counted per place', async () => {
  const db = await createTestDatabase();
  // A deployment at 0006, with three machines in two places: two reported, one report unreadable;
  // a and an unprovided machine held, a read Off, b's power read failed, c never read.
  await migrateTo(db, THROUGH_0006);
  // AgentHardwareReport { report: Node { memory_installed_bytes: 1024, cpu { hardware_threads: 16 }, block_device { capacity_bytes: 100 } } }
  const report = Buffer.from('0a0b408008520248105a023064', 'hex');
  for (const [name, location, raw] of [
    ['a', 'da11', report],
    ['b', 'da11', Buffer.from('0aff', 'hex')],
    ['c', null, report],
  ] as const) {
    await db.admin(
      `WITH m AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id),
       p AS (INSERT INTO machine_provided (machine_id, provider, provider_id, provider_location)
             SELECT machine_id, 'Old', $1, $2 FROM m)
       INSERT INTO machine_hardware_report SELECT machine_id, $3, now() FROM m`,
      [name, location, raw],
    );
  }
  await db.admin(`
    WITH spare AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id)
    INSERT INTO machine_hold (machine_id, hold_reason, hold_actor)
    SELECT machine_id, 'rack work', 'tech' FROM machine_provided WHERE provider_id = 'a'
    UNION ALL SELECT machine_id, 'spare', 'tech' FROM spare`);
  await db.admin(`
    UPDATE machine_power_state ps SET power_state = CASE mp.provider_id WHEN 'a' THEN 'Off' END,
      power_read_failed_at = CASE mp.provider_id WHEN 'b' THEN now() END
    FROM machine_provided mp WHERE mp.machine_id = ps.machine_id`);

  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual([
    '0008_fleet_metrics',
    '0009_os_installation',
    '0010_installation_report_key',
    '0011_root_device_hints',
    '0012_disk_wipe',
    '0013_agent_log',
    '0014_agent_enrollment',
    '0015_agent_boot_method',
    '0016_network_boot',
    '0018_retired_machines',
    '0019_first_boot',
  ]);
  expect(await controlByLocation(bmdb.db)).toEqual([
    {
      provider: '',
      location: '',
      held: 1,
      powerStates: { On: 0, Off: 0, PoweringOn: 0, PoweringOff: 0, Unknown: 0, Unread: 0 },
      powerReadFailed: 0,
    },
    {
      provider: 'Old',
      location: '',
      held: 0,
      powerStates: { On: 0, Off: 0, PoweringOn: 0, PoweringOff: 0, Unknown: 0, Unread: 1 },
      powerReadFailed: 0,
    },
    {
      provider: 'Old',
      location: 'da11',
      held: 1,
      powerStates: { On: 0, Off: 1, PoweringOn: 0, PoweringOff: 0, Unknown: 0, Unread: 1 },
      powerReadFailed: 1,
    },
  ]);
  const { rows } = await db.admin(`
    SELECT mp.provider_id, h.provider, h.provider_location, h.cpu_threads::int, h.memory_bytes::int, h.disks,
           h.disk_bytes::int
    FROM machine_hardware_report h JOIN machine_provided mp USING (machine_id) ORDER BY 1`);
  expect(rows).toEqual([
    {
      provider_id: 'a',
      provider: 'Old',
      provider_location: 'da11',
      cpu_threads: 16,
      memory_bytes: 1024,
      disks: 1,
      disk_bytes: 100,
    },
    {
      provider_id: 'b',
      provider: 'Old',
      provider_location: 'da11',
      cpu_threads: null,
      memory_bytes: null,
      disks: null,
      disk_bytes: null,
    },
    {
      provider_id: 'c',
      provider: 'Old',
      provider_location: null,
      cpu_threads: 16,
      memory_bytes: 1024,
      disks: 1,
      disk_bytes: 100,
    },
  ]);
  const q = bmdb.db;
  expect(await hardwareByLocation(q)).toEqual([
    { provider: 'Old', location: '', machines: 1, cpuThreads: 16, memoryBytes: 1024, disks: 1, diskBytes: 100 },
    { provider: 'Old', location: 'da11', machines: 1, cpuThreads: 16, memoryBytes: 1024, disks: 1, diskBytes: 100 },
  ]);
  expect((await fleetStagesByLocation(q)).locations.map((l) => [l.location, l.stages.provided])).toEqual([
    ['', 1],
    ['da11', 2],
  ]);
});

/** `db` as a deployment that ran only `migrations` (released ones) left it. */
test('a database migrated to 0008, as released before OS installation, takes 0009', async () => {
  const db = await createTestDatabase();
  await migrateTo(db, { ...THROUGH_0006, '0008_fleet_metrics': fleetMetrics });
  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual([
    '0009_os_installation',
    '0010_installation_report_key',
    '0011_root_device_hints',
    '0012_disk_wipe',
    '0013_agent_log',
    '0014_agent_enrollment',
    '0015_agent_boot_method',
    '0016_network_boot',
    '0018_retired_machines',
    '0019_first_boot',
  ]);
  expect((await db.admin('SELECT count(*)::int AS n FROM machine_os_installation_request')).rows).toEqual([{ n: 0 }]);
});

test('0018 on a database with agents: the BMC-booted machines’ agent tags are flagged, then kept so by triggers', async () => {
  const db = await createTestDatabase();
  await migrateTo(db, {
    ...THROUGH_0006,
    '0008_fleet_metrics': fleetMetrics,
    '0009_os_installation': osInstallation,
    '0010_installation_report_key': installationReportKey,
    '0011_root_device_hints': rootDeviceHints,
    '0012_disk_wipe': diskWipe,
    '0013_agent_log': agentLog,
    '0014_agent_enrollment': agentEnrollment,
    '0015_agent_boot_method': agentBootMethod,
  });
  // Started and heartbeating: a BMC-booted machine, an SSH one, and a BMC-booted one never heartbeating.
  const ids: Record<string, string> = {};
  for (const name of ['bmc', 'ssh', 'silent']) {
    const { rows } = await db.admin(
      `WITH m AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id)
       INSERT INTO machine_provided (machine_id, provider, provider_id) SELECT machine_id, 'Old', $1 FROM m
       RETURNING machine_id`,
      [name],
    );
    ids[name] = rows[0].machine_id;
    await db.admin(`INSERT INTO machine_agent_started VALUES ($1, now(), '\\x00')`, [ids[name]]);
  }
  await db.admin(`INSERT INTO machine_agent_boot VALUES ($1, 'network'), ($2, 'virtual-media')`, [ids.bmc, ids.silent]);
  await db.admin('INSERT INTO machine_agent_heartbeat VALUES ($1, now()), ($2, now())', [ids.bmc, ids.ssh]);

  const bmdb = await openTestBMDB(db, { migrate: false });
  expect(await bmdb.migrate()).toEqual(['0016_network_boot', '0018_retired_machines', '0019_first_boot']);
  const flags = async () => ({
    started: Object.fromEntries(
      (
        await db.admin(
          'SELECT mp.provider_id, a.agent_boot FROM machine_agent_started a JOIN machine_provided mp USING (machine_id)',
        )
      ).rows.map((r) => [r.provider_id, r.agent_boot]),
    ),
    heartbeat: Object.fromEntries(
      (
        await db.admin(
          'SELECT mp.provider_id, h.agent_boot FROM machine_agent_heartbeat h JOIN machine_provided mp USING (machine_id)',
        )
      ).rows.map((r) => [r.provider_id, r.agent_boot]),
    ),
  });
  expect(await flags()).toEqual({
    started: { bmc: true, ssh: false, silent: true },
    heartbeat: { bmc: true, ssh: false },
  });

  // The SSH machine switched to a BMC boot, and the never-heartbeating one heartbeats at last.
  await db.admin(`INSERT INTO machine_agent_boot VALUES ($1, 'network')`, [ids.ssh]);
  await db.admin('INSERT INTO machine_agent_heartbeat VALUES ($1, now())', [ids.silent]);
  // A heartbeat's upsert of an existing row keeps its flag.
  await db.admin(
    `INSERT INTO machine_agent_heartbeat VALUES ($1, now()) ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at`,
    [ids.bmc],
  );
  // The BMC-booted one switched to SSH.
  await db.admin('DELETE FROM machine_agent_boot WHERE machine_id = $1', [ids.bmc]);
  expect(await flags()).toEqual({
    started: { bmc: false, ssh: true, silent: true },
    heartbeat: { bmc: false, ssh: true, silent: true },
  });
  // A machine whose tags and boot method go together is deleted cleanly.
  await db.admin('DELETE FROM machines WHERE machine_id = $1', [ids.silent]);
  expect((await flags()).started).toEqual({ bmc: false, ssh: true });
});

test('0012: a request is a disk image with its image and disk, or a disk wipe with neither; older rows are disk images', async () => {
  const db = await createTestDatabase();
  const bmdb = await openTestBMDB(db, { migrate: true });
  const q = bmdb.db;
  const image = await newMachine(q);
  await requestOSInstallation(q, image, {
    imageUrl: 'http://images.example/os.raw',
    imageSha256: 'a'.repeat(64),
    rootDevice: '/dev/sda',
    actor: 'test',
    reason: 'migration test',
  });
  const wipe = await newMachine(q);
  await requestDiskWipe(q, wipe, { actor: 'test', reason: 'migration test', decommission: true });
  expect(
    (
      await db.admin(
        'SELECT request_kind, decommission, image_url IS NULL AS no_image FROM machine_os_installation_request ORDER BY request_kind',
      )
    ).rows,
  ).toEqual([
    { request_kind: 'DiskImage', decommission: false, no_image: false },
    { request_kind: 'DiskWipe', decommission: true, no_image: true },
  ]);
  for (const change of [
    `UPDATE machine_os_installation_request SET image_url = 'http://images.example/os.raw' WHERE request_kind = 'DiskWipe'`,
    `UPDATE machine_os_installation_request SET image_url = NULL WHERE request_kind = 'DiskImage'`,
    `UPDATE machine_os_installation_request SET decommission = true WHERE request_kind = 'DiskImage'`,
  ]) {
    await expect(db.admin(change), change).rejects.toThrow(/machine_os_installation_request_kind_fields/);
  }
  await bmdb.close();
});

async function migrateTo(db: TestDatabase, migrations: Record<string, Migration>): Promise<void> {
  const released = new Kysely<unknown>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: db.url }) }),
  });
  const { error } = await new Migrator({
    db: released,
    provider: { getMigrations: async () => migrations },
    migrationTableName: 'bmdb_migration',
    migrationLockTableName: 'bmdb_migration_lock',
  }).migrateToLatest();
  await released.destroy();
  expect(error).toBeUndefined();
}
