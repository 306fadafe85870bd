import { type BMDB, BMDBError, ConnectionClosedError } from '@bmaas/bmdb-controlloop';
import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import { Registry } from 'prom-client';
import { afterEach, beforeAll, describe, expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB, type TestDatabase, testBMDB } from '../../../test/support/database.js';
import { type SeededFleet, seedFleet } from '../../../test/support/fleet.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually } from '../../../test/support/wait.js';
import {
  AgentHeartbeats,
  addProvided,
  backoffsByProcess,
  controlByLocation,
  decommissionMachines,
  type FleetMetrics,
  fleetStages,
  fleetStagesByLocation,
  hardwareByLocation,
  holdMachine,
  MACHINE_STAGES,
  newestAgentHeartbeatAge,
  newMachine,
  recordPowerState,
  requestOSInstallation,
  sessionsByProcessor,
  setAgentStarted,
  startFleetMetrics,
  unholdMachine,
  updateProviderStatus,
} from '../src/index.js';

/** A hardware report of `threads` CPU threads over two CPUs, `memory` bytes and one disk of `disk` bytes. */
function hardwareReport(threads: number, memory: number, disk: number): Uint8Array {
  const cpu = new BinaryWriter()
    .tag(9, WireType.Varint)
    .int32(threads / 2)
    .finish();
  const node = new BinaryWriter()
    .tag(8, WireType.Varint)
    .int64(memory)
    .tag(10, WireType.LengthDelimited)
    .bytes(cpu)
    .tag(10, WireType.LengthDelimited)
    .bytes(cpu)
    .tag(11, WireType.LengthDelimited)
    .bytes(new BinaryWriter().tag(6, WireType.Varint).int64(disk).finish())
    .finish();
  return new BinaryWriter().tag(1, WireType.LengthDelimited).bytes(node).finish();
}

/** The samples of one metric of `registry`, as `labels → value` (labels sorted, `name=value` joined). */
async function samples(registry: Registry, name: string): Promise<Record<string, number> | undefined> {
  const metric = registry.getSingleMetric(name);
  if (!metric) return undefined;
  const { values } = await metric.get();
  return Object.fromEntries(
    values.map((v) => [
      Object.entries(v.labels)
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([k, l]) => `${k}=${l}`)
        .join(','),
      v.value,
    ]),
  );
}

/** The fleet's totals per place as the triggers keep them, and as counted from the tables. */
async function totalsKeptAndCounted(db: TestDatabase) {
  const kept = await db.admin(`
    SELECT provider, provider_location AS location, sum(machines)::int AS machines,
           sum(reported_machines)::int AS reported, sum(cpu_threads)::bigint::text AS cpu,
           sum(memory_bytes)::bigint::text AS memory, sum(disks)::int AS disks,
           sum(disk_bytes)::bigint::text AS disk_bytes, sum(held)::int AS held, sum(power_on)::int AS on,
           sum(power_off)::int AS off, sum(powering_on)::int AS powering_on, sum(powering_off)::int AS powering_off,
           sum(power_unknown)::int AS unknown, sum(power_unread)::int AS unread,
           sum(power_read_failed)::int AS read_failed, sum(installed)::int AS installed
    FROM fleet_location_totals GROUP BY 1, 2
    HAVING sum(machines) <> 0 OR sum(reported_machines) <> 0 OR sum(held) <> 0 OR sum(installed) <> 0 ORDER BY 1, 2`);
  const counted = await db.admin(`
    WITH places AS (
      SELECT coalesce(mp.provider, '') AS provider, coalesce(mp.provider_location, '') AS location,
             mp.machine_id IS NOT NULL AS provided, h.cpu_threads, h.memory_bytes, h.disks, h.disk_bytes,
             hd.machine_id IS NOT NULL AS held, ps.machine_id IS NOT NULL AS powered, ps.power_state,
             ps.power_read_failed_at IS NOT NULL AS read_failed, iq.installation_state = 'Succeeded' AS installed
      FROM machines m LEFT JOIN machine_provided mp USING (machine_id)
      LEFT JOIN machine_os_installation_request iq USING (machine_id)
      LEFT JOIN machine_hardware_report h USING (machine_id)
      LEFT JOIN machine_hold hd USING (machine_id)
      LEFT JOIN machine_power_state ps USING (machine_id))
    SELECT provider, location, count(*) FILTER (WHERE provided)::int AS machines,
           count(cpu_threads)::int AS reported, coalesce(sum(cpu_threads), 0)::bigint::text AS cpu,
           coalesce(sum(memory_bytes), 0)::bigint::text AS memory, coalesce(sum(disks), 0)::int AS disks,
           coalesce(sum(disk_bytes), 0)::bigint::text AS disk_bytes, count(*) FILTER (WHERE held)::int AS held,
           count(*) FILTER (WHERE power_state = 'On')::int AS on, count(*) FILTER (WHERE power_state = 'Off')::int AS off,
           count(*) FILTER (WHERE power_state = 'PoweringOn')::int AS powering_on,
           count(*) FILTER (WHERE power_state = 'PoweringOff')::int AS powering_off,
           count(*) FILTER (WHERE power_state = 'Unknown')::int AS unknown,
           count(*) FILTER (WHERE powered AND power_state IS NULL)::int AS unread,
           count(*) FILTER (WHERE powered AND read_failed)::int AS read_failed,
           count(*) FILTER (WHERE installed)::int AS installed
    FROM places GROUP BY 1, 2
    HAVING count(*) FILTER (WHERE provided) <> 0 OR count(cpu_threads) <> 0 OR count(*) FILTER (WHERE held) <> 0
      OR count(*) FILTER (WHERE installed) <> 0
    ORDER BY 1, 2`);
  return { kept: kept.rows, counted: counted.rows };
}

describe('fleet_location_totals', () => {
  test('follows machines, reports, holds, power states and installations through every change, matching a count of the tables', async () => {
    const db = await createTestDatabase();
    const bmdb = await openTestBMDB(db);
    const session = await bmdb.startSession({ processor: 'test' });
    const key = new Uint8Array(32).fill(1);
    const machines: string[] = [];
    // Machines in three places, most with a started agent.
    for (let i = 0; i < 12; i++) {
      machines.push(
        await session.transact(async (q) => {
          const id = await newMachine(q);
          await addProvided(q, id, {
            provider: i % 4 === 3 ? 'Static' : 'Equinix',
            providerId: `m${i}`,
            providerLocation: i % 4 === 3 ? null : ['da11', 'am6'][i % 2],
          });
          if (i % 6 !== 5) await setAgentStarted(q, id, { publicKey: key });
          return id;
        }),
      );
    }
    const check = async (step: string) => {
      const { kept, counted } = await totalsKeptAndCounted(db);
      expect(kept, step).toEqual(counted);
    };
    const heartbeat = (machineId: string, report: Uint8Array) =>
      AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key, hardwareReport: report });
    await check('provided');
    // Reports stored, a second time unchanged, then changed; one that cannot be read.
    for (const [i, id] of machines.entries()) {
      if (i % 6 !== 5)
        expect(await heartbeat(id, hardwareReport(8 * (i + 1), 2 ** 30 * (i + 1), 10 ** 12))).toBe('recorded');
    }
    await check('reported');
    await heartbeat(machines[0] as string, hardwareReport(8, 2 ** 30, 10 ** 12));
    await heartbeat(machines[1] as string, hardwareReport(256, 2 ** 40, 4 * 10 ** 12));
    await heartbeat(machines[2] as string, new Uint8Array([0x0a, 0xff]));
    await check('reported again');
    // Holds taken (one on a machine without a Provided tag) and power states read, changed, failed.
    const loose = await session.transact((q) => newMachine(q));
    await session.transact(async (q) => {
      for (const id of [machines[0], machines[3], machines[6], loose] as string[]) {
        await holdMachine(q, id, { reason: 'rack work', actor: 'tech@rack1' });
      }
      await recordPowerState(q, machines[0] as string, { state: 'Off' });
      await recordPowerState(q, machines[1] as string, { state: 'On' });
      await recordPowerState(q, machines[2] as string, { state: 'PoweringOn' });
      await recordPowerState(q, machines[3] as string, { state: 'Unknown' });
      await recordPowerState(q, machines[4] as string, { failure: 'BMC unreachable' });
      await recordPowerState(q, machines[5] as string, { state: 'On' });
    });
    await check('held and powered');
    await session.transact(async (q) => {
      await recordPowerState(q, machines[2] as string, { state: 'On' });
      await recordPowerState(q, machines[5] as string, { failure: 'BMC refused' });
      await recordPowerState(q, machines[4] as string, { state: 'PoweringOff' });
      await unholdMachine(q, machines[6] as string, { actor: 'tech@rack1' });
    });
    await check('power changed, a hold released');
    // Installations: two succeed (their agents' tags go), one fails, one is requested; one installed is
    // requested again (no longer installed), then succeeds again.
    const install = (machineId: string) =>
      session.transact((q) =>
        requestOSInstallation(q, machineId, {
          imageUrl: 'https://images.example.com/os.img',
          imageSha256: 'ab'.repeat(32),
          rootDevice: '/dev/sda',
          actor: 'tech@rack1',
          reason: 'test',
        }),
      );
    const reportInstallation = async (machineId: string, result: 'Success' | 'Error') => {
      const { generation } = await install(machineId);
      const raw = new Uint8Array();
      expect(
        await AgentHeartbeats.of(bmdb).record({
          machineId,
          publicKey: key,
          installationReport: { generation, result, raw },
        }),
      ).toBe('recorded');
    };
    await reportInstallation(machines[1] as string, 'Success');
    await reportInstallation(machines[2] as string, 'Success');
    await reportInstallation(machines[4] as string, 'Error');
    await install(machines[7] as string);
    await check('installed');
    // An installed machine runs its OS: an agent started on it by hand is refused.
    const refused = session.transact((q) => setAgentStarted(q, machines[2] as string, { publicKey: key }));
    await expect(refused).rejects.toThrow(BMDBError);
    await expect(refused).rejects.toThrow(
      `machine ${machines[2]} is installed (its OS installation succeeded): request an installation again before starting its agent`,
    );
    await install(machines[1] as string);
    await check('installed machine requested again');
    await db.admin('DELETE FROM machine_os_installation_request WHERE machine_id = $1', [machines[1]]);
    await db.admin(
      `INSERT INTO machine_os_installation_request (machine_id, generation, image_url, image_sha256, root_device,
         compression, requested_by, installation_state)
       VALUES ($1, 9, 'https://images.example.com/os.img', $2, '/dev/sda', 'none', 'tech', 'Succeeded')`,
      [machines[1], 'ab'.repeat(32)],
    );
    await check('installed again');
    // Moved between locations and providers, location cleared and set.
    await session.transact(async (q) => {
      await updateProviderStatus(q, 'Equinix', 'm0', { providerLocation: 'am6' });
      await updateProviderStatus(q, 'Equinix', 'm1', { providerLocation: 'da11' });
      await updateProviderStatus(q, 'Static', 'm3', { providerLocation: 'rack1' });
      await updateProviderStatus(q, 'Equinix', 'm4', { providerLocation: null });
    });
    await db.admin(`UPDATE machine_provided SET provider = 'Dummy' WHERE provider_id = 'm6'`);
    await check('moved');
    // Provided tag removed and added back; reports and machines removed.
    await db.admin(`DELETE FROM machine_provided WHERE provider_id IN ('m7', 'm3')`);
    await check('unprovided');
    await session.transact(async (q) => {
      await addProvided(q, machines[7] as string, { provider: 'Equinix', providerId: 'm7', providerLocation: 'fr2' });
      await addProvided(q, loose, { provider: 'Static', providerId: 'loose', providerLocation: 'rack9' });
    });
    await db.admin('DELETE FROM machine_hardware_report WHERE machine_id = $1', [machines[8]]);
    const report = await session.transact((q) => decommissionMachines(q, 'Equinix', ['m9', 'm10']));
    expect(report.removed).toHaveLength(2);
    await check('decommissioned');
    // Whatever the order of the cascade, a machine deleted takes all it counted.
    await db.admin('DELETE FROM machines WHERE machine_id = ANY($1)', [[machines[0], machines[11], loose]]);
    await check('deleted');
    await session.close();
  });
});

describe('fleet per provider and location', () => {
  let db: TestDatabase;
  let bmdb: BMDB;
  let fleet: SeededFleet;

  beforeAll(async () => {
    ({ db, bmdb } = await testBMDB());
    fleet = await seedFleet(db, bmdb);
    expect(
      await AgentHeartbeats.of(bmdb).record({
        machineId: fleet.heartbeating,
        publicKey: new Uint8Array(32).fill(7),
        hardwareReport: hardwareReport(128, 2 ** 39, 4 * 10 ** 12),
      }),
    ).toBe('recorded');
  });

  test('the stages by location add up to the fleet stages, each machine where it is', async () => {
    const q = bmdb.db;
    const { unprovided, locations } = await fleetStagesByLocation(q);
    const { stages } = await fleetStages(q);
    expect(unprovided).toBe(stages.unprovided);
    expect(locations).toEqual([
      {
        provider: 'Dummy',
        location: '',
        stages: {
          unprovided: 0,
          provided: 2,
          agentStarting: 1,
          agentStarted: 1,
          heartbeating: 0,
          awaitingRecovery: 1,
          installed: 1,
        },
      },
      {
        provider: 'Equinix',
        location: 'da11',
        stages: {
          unprovided: 0,
          provided: 0,
          agentStarting: 0,
          agentStarted: 0,
          heartbeating: 1,
          awaitingRecovery: 0,
          installed: 0,
        },
      },
    ]);
    for (const stage of MACHINE_STAGES.filter((stage) => stage !== 'unprovided')) {
      expect(
        locations.reduce((sum, l) => sum + l.stages[stage], 0),
        stage,
      ).toBe(stages[stage]);
    }
    // The recoverer's thresholds decide who is lost: with a first heartbeat due within 10 s, the agent started a minute ago is.
    const strict = await fleetStagesByLocation(q, { firstHeartbeatWithin: 10_000 });
    expect(strict.locations[0]?.stages).toMatchObject({ agentStarted: 0, awaitingRecovery: 2 });
  });

  test('hardware, backoffs, sessions and the newest heartbeat', async () => {
    const q = bmdb.db;
    expect(await hardwareByLocation(q)).toEqual([
      {
        provider: 'Equinix',
        location: 'da11',
        machines: 1,
        cpuThreads: 128,
        memoryBytes: 2 ** 39,
        disks: 1,
        diskBytes: 4 * 10 ** 12,
      },
    ]);
    expect(await backoffsByProcess(q)).toEqual({
      ShepherdAccess: 0,
      ShepherdAgentStart: 1,
      ShepherdRecovery: 0,
      ShepherdPowerAction: 0,
      ShepherdAgentBoot: 0,
    });
    // The awaiting-recovery machine is held and powered off; others read On, PoweringOn, or failed.
    expect(await controlByLocation(q)).toEqual([
      {
        provider: 'Dummy',
        location: '',
        held: 1,
        powerStates: { On: 0, Off: 1, PoweringOn: 1, PoweringOff: 0, Unknown: 0, Unread: 4 },
        powerReadFailed: 1,
      },
      {
        provider: 'Equinix',
        location: 'da11',
        held: 0,
        powerStates: { On: 1, Off: 0, PoweringOn: 0, PoweringOff: 0, Unknown: 0, Unread: 0 },
        powerReadFailed: 0,
      },
    ]);
    expect(await sessionsByProcessor(q)).toEqual([
      { componentName: 'test', processor: 'shepherd-initializer', sessions: 1 },
    ]);
    const age = await newestAgentHeartbeatAge(q);
    expect(age).toBeGreaterThanOrEqual(0);
    expect(age).toBeLessThan(60);
  });
});

describe('FleetMetrics', () => {
  let db: TestDatabase;
  let bmdb: BMDB;
  let fleet: SeededFleet;
  const readers: FleetMetrics[] = [];
  const start = (registry: Registry, on = bmdb) => {
    const reader = startFleetMetrics(on, { registry, interval: 1000 });
    readers.push(reader);
    return reader;
  };

  beforeAll(async () => {
    ({ db, bmdb } = await testBMDB());
    fleet = await seedFleet(db, bmdb);
  });
  afterEach(async () => {
    await Promise.all(readers.splice(0).map((reader) => reader.close()));
  });
  /** The backend holding the reader lock, if one does. */
  const holder = async () =>
    (
      await db.admin(
        `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = $1`,
        [
          // The low half of the reader's lock key.
          0x5f666c74,
        ],
      )
    ).rows[0]?.pid as number | undefined;

  test('one of two readers reads and exports the fleet; the other only its own state, until it takes over', async () => {
    const first = new Registry();
    const second = new Registry();
    const a = start(first);
    const other = await openTestBMDB(db);
    const b = start(second, other);
    const leader = await eventually('a reader leading', async () => (a.leading ? a : b.leading ? b : undefined));
    const [leaderRegistry, followerRegistry, follower] = leader === a ? [first, second, b] : [second, first, a];
    await eventually(
      'the fleet read',
      async () =>
        (await samples(leaderRegistry, 'bmdb_fleet_machines'))?.['location=da11,provider=Equinix,stage=heartbeating'],
    );
    expect(await samples(leaderRegistry, 'bmdb_fleet_machines')).toEqual({
      'location=,provider=,stage=unprovided': 1,
      'location=,provider=Dummy,stage=provided': 2,
      'location=,provider=Dummy,stage=agentStarting': 1,
      'location=,provider=Dummy,stage=agentStarted': 1,
      'location=,provider=Dummy,stage=heartbeating': 0,
      'location=,provider=Dummy,stage=awaitingRecovery': 1,
      'location=,provider=Dummy,stage=installed': 1,
      'location=da11,provider=Equinix,stage=provided': 0,
      'location=da11,provider=Equinix,stage=agentStarting': 0,
      'location=da11,provider=Equinix,stage=agentStarted': 0,
      'location=da11,provider=Equinix,stage=heartbeating': 1,
      'location=da11,provider=Equinix,stage=awaitingRecovery': 0,
      'location=da11,provider=Equinix,stage=installed': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_os_installations')).toEqual({
      'state=Requested': 0,
      'state=Delivered': 0,
      'state=Succeeded': 1,
      'state=Failed': 1,
      'state=Canceled': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_backoffs')).toEqual({
      'process=ShepherdAccess': 0,
      'process=ShepherdAgentStart': 1,
      'process=ShepherdRecovery': 0,
      'process=ShepherdPowerAction': 0,
      'process=ShepherdAgentBoot': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_work')).toEqual({
      'process=ShepherdAccess': 0,
      'process=ShepherdAgentStart': 1,
      'process=ShepherdRecovery': 0,
      'process=ShepherdPowerAction': 0,
      'process=ShepherdAgentBoot': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_holds')).toEqual({
      'location=,provider=Dummy': 1,
      'location=da11,provider=Equinix': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_power_states')).toMatchObject({
      'location=,provider=Dummy,state=Off': 1,
      'location=,provider=Dummy,state=PoweringOn': 1,
      'location=,provider=Dummy,state=Unread': 4,
      'location=da11,provider=Equinix,state=On': 1,
      'location=da11,provider=Equinix,state=Off': 0,
    });
    expect(Object.keys((await samples(leaderRegistry, 'bmdb_fleet_power_states')) ?? {})).toHaveLength(12);
    expect(await samples(leaderRegistry, 'bmdb_fleet_power_read_failures')).toEqual({
      'location=,provider=Dummy': 1,
      'location=da11,provider=Equinix': 0,
    });
    expect(await samples(leaderRegistry, 'bmdb_fleet_sessions')).toEqual({
      'component=test,processor=shepherd-initializer': 1,
    });
    const age = (await samples(leaderRegistry, 'bmdb_fleet_newest_agent_heartbeat_age_seconds'))?.[''];
    expect(age).toBeGreaterThanOrEqual(5);
    expect(age).toBeLessThan(60);
    expect(await samples(leaderRegistry, 'bmdb_fleet_reader_leading')).toEqual({ '': 1 });
    expect(await samples(leaderRegistry, 'bmdb_up')).toEqual({ '': 1 });
    expect(await samples(leaderRegistry, 'bmdb_fleet_reading_duration_seconds')).toMatchObject({
      '': expect.any(Number),
    });

    // The other process reaches the BMDB but reads nothing: no series of the fleet.
    await eventually('the follower reached the BMDB', async () => (await samples(followerRegistry, 'bmdb_up'))?.['']);
    expect(await samples(followerRegistry, 'bmdb_fleet_reader_leading')).toEqual({ '': 0 });
    for (const name of ['bmdb_fleet_machines', 'bmdb_fleet_backoffs', 'bmdb_fleet_sessions']) {
      expect(await samples(followerRegistry, name), name).toEqual({});
    }

    // A hardware report shows in the next reading.
    await AgentHeartbeats.of(bmdb).record({
      machineId: fleet.heartbeating,
      publicKey: new Uint8Array(32).fill(7),
      hardwareReport: hardwareReport(64, 2 ** 38, 10 ** 12),
    });
    await eventually(
      'the hardware read',
      async () =>
        (await samples(leaderRegistry, 'bmdb_fleet_hardware_cpu_threads'))?.['location=da11,provider=Equinix'],
    );
    expect(await samples(leaderRegistry, 'bmdb_fleet_hardware_memory_bytes')).toEqual({
      'location=da11,provider=Equinix': 2 ** 38,
    });

    // The leader stops: its gauges go, and the other takes over.
    await leader.close();
    expect(await samples(leaderRegistry, 'bmdb_fleet_machines')).toEqual({});
    await eventually('the other reader leading', async () => follower.leading || undefined);
    await eventually(
      'the other reader read',
      async () => (await samples(followerRegistry, 'bmdb_fleet_machines'))?.['location=,provider=,stage=unprovided'],
    );
  });

  test('a reader whose connection is killed takes the lock again on a new one and reads on', async () => {
    const registry = new Registry();
    const own = await openTestBMDB(db);
    const reader = start(registry, own);
    const unprovided = async () =>
      (await samples(registry, 'bmdb_fleet_machines'))?.['location=,provider=,stage=unprovided'];
    await eventually('leading and read', async () => (reader.leading ? unprovided() : undefined));
    const pid = await holder();
    expect(pid).toBeDefined();
    await db.admin('SELECT pg_terminate_backend($1)', [pid]);
    const next = await eventually('the lock held again', async () => {
      const now = await holder();
      return now !== undefined && now !== pid ? now : undefined;
    });
    await eventually('read again', async () => (reader.leading ? unprovided() : undefined));
    expect(await holder()).toBe(next);
  });

  test('bmdb_up is 0 while the BMDB cannot be reached, and 1 again once it can', async () => {
    const { proxy, url } = await TcpProxy.for(db.url);
    try {
      const registry = new Registry();
      const own = await openTestBMDB(db, { url });
      const reader = start(registry, own);
      await eventually('reached', async () => ((await samples(registry, 'bmdb_up'))?.[''] === 1 ? true : undefined));
      proxy.cut();
      await eventually('unreachable', async () =>
        (await samples(registry, 'bmdb_up'))?.[''] === 0 ? true : undefined,
      );
      expect(reader.leading).toBe(false);
      expect(await samples(registry, 'bmdb_fleet_machines')).toEqual({});
      proxy.restore();
      await eventually('reached again', async () =>
        (await samples(registry, 'bmdb_up'))?.[''] === 1 ? true : undefined,
      );
      await reader.close();
    } finally {
      await proxy.close();
    }
  });

  test('a reader whose connection goes half-open stops exporting within its interval; the one taking over exports alone', async () => {
    const { proxy, url } = await TcpProxy.for(db.url);
    try {
      const stalledRegistry = new Registry();
      const stalled = start(stalledRegistry, await openTestBMDB(db, { url }));
      const unprovided = async (registry: Registry) =>
        (await samples(registry, 'bmdb_fleet_machines'))?.['location=,provider=,stage=unprovided'];
      await eventually('leading and read', async () => (stalled.leading ? unprovided(stalledRegistry) : undefined));
      const otherRegistry = new Registry();
      const other = start(otherRegistry);
      await eventually('the other reached the BMDB', async () =>
        (await samples(otherRegistry, 'bmdb_up'))?.[''] === 1 ? true : undefined,
      );
      expect(other.leading).toBe(false);
      const pid = await holder();
      expect(pid).toBeDefined();

      // The path to the BMDB stops answering without closing; the BMDB ends the backend (as its keepalives
      // would), which frees the lock.
      proxy.stall();
      await db.admin('SELECT pg_terminate_backend($1)', [pid]);
      await eventually('the other reading', async () => (other.leading ? unprovided(otherRegistry) : undefined));
      await eventually('the stalled reader given up', async () =>
        (await samples(stalledRegistry, 'bmdb_up'))?.[''] === 0 ? true : undefined,
      );
      expect(stalled.leading).toBe(false);
      expect(await samples(stalledRegistry, 'bmdb_fleet_reader_leading')).toEqual({ '': 0 });
      expect(await samples(stalledRegistry, 'bmdb_fleet_machines')).toEqual({});

      // The path answers again: the reader is back, and follows.
      proxy.restore();
      await eventually('reached again', async () =>
        (await samples(stalledRegistry, 'bmdb_up'))?.[''] === 1 ? true : undefined,
      );
      expect(stalled.leading).toBe(false);
      expect(await samples(stalledRegistry, 'bmdb_fleet_machines')).toEqual({});
      expect(other.leading).toBe(true);
      await stalled.close();
    } finally {
      await proxy.close();
    }
  });

  test("a BMDB's close stops the readers started on it, lock and gauges; a closed one starts none", async () => {
    const own = await openTestBMDB(db);
    const registry = new Registry();
    const reader = start(registry, own);
    await eventually('the reader leading', async () => (reader.leading ? true : undefined));
    expect(await holder()).toBeDefined();
    await own.close();
    expect(reader.leading).toBe(false);
    expect(await samples(registry, 'bmdb_fleet_machines')).toEqual({});
    await eventually('the reader lock released', async () => ((await holder()) === undefined ? true : undefined));
    expect(() => startFleetMetrics(own, { registry: new Registry(), interval: 1000 })).toThrow(ConnectionClosedError);
  });

  test('an interval under a second, or a registry read twice, is refused', () => {
    expect(() => startFleetMetrics(bmdb, { registry: new Registry(), interval: 500 })).toThrow(
      /at least 1s, got 500ms/,
    );
    const registry = new Registry();
    start(registry);
    expect(() => start(registry)).toThrow(/bmdb_fleet_machines is already registered/);
  });
});
