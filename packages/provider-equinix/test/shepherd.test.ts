/**
 * The shepherd end to end on Equinix: the real Provisioner, Initializer and
 * Recoverer of @bmaas/shepherd-manager driving EquinixProvider (the
 * recoverer through EquinixPower) against the fake Equinix API and a real
 * PostgreSQL BMDB, as the original's smoke tests
 * did against its fake, plus the orphan-adoption and idempotent-create paths
 * through the provisioner.
 */
import { type ControlLoopOptions, parseLimiter, SessionExpiredError } from '@bmaas/bmdb-controlloop';
import { type ProvidedMachine, ProviderStatus, providedMachines, workHistory } from '@bmaas/bmdb-model';
import {
  Initializer,
  type Provider,
  ProviderDiscrepancyError,
  Provisioner,
  type ProvisionerOptions,
  Recoverer,
} from '@bmaas/shepherd-manager';
import { FakeSshClient } from '@bmaas/shepherd-manager/testing';
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { runUntil } from '../../../test/support/wait.js';
import { refId } from '../src/api/types.js';
import {
  DeviceNotRecordedError,
  EQUINIX_PROVIDER,
  type EquinixDevice,
  EquinixPower,
  EquinixProvider,
  type EquinixProviderOptions,
  EquinixStatusUpdater,
} from '../src/index.js';
import { FakeEquinixApi, type FakeFault } from '../src/testing/index.js';
import { fastClient } from './helpers.js';

const PREFIX = 'e2e-';
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFc0gXoIKZ7PSJtVk0V1YeZ0m3c0p3dTk0lIFOgM3Ol5 shepherd@test';
const CREATE = 'POST /projects/{id}/devices';
const ACTIONS = 'POST /devices/{id}/actions';

const fakes: FakeEquinixApi[] = [];

const { db, bmdb } = await testBMDB();
afterAll(async () => {
  await Promise.all(fakes.map((fake) => fake.close()));
});

/** A fake project with `reservations` free reservations, and the provider for it. */
async function fakeProject(
  reservations: number,
  options: Partial<EquinixProviderOptions> = {},
): Promise<{ api: FakeEquinixApi; provider: EquinixProvider }> {
  const api = await FakeEquinixApi.start({ reservations });
  fakes.push(api);
  const provider = new EquinixProvider({
    client: fastClient(api),
    projectId: api.projectId,
    devicePrefix: PREFIX,
    os: 'ubuntu_22_04',
    sshKeyLabel: 'shepherd',
    sshPublicKey: KEY,
    ...options,
  });
  return { api, provider };
}

const fastLimiters = (): Pick<ProvisionerOptions, 'reconcileLimiter' | 'creationLimiter'> => ({
  reconcileLimiter: parseLimiter('1ms,1'),
  creationLimiter: parseLimiter('1ms,100'),
});

const loopOptions = (signal: AbortSignal): ControlLoopOptions => ({
  signal,
  parallelism: 2,
  claimLimiter: parseLimiter('1ms,1000'),
});

/** The BMDB's Equinix machines. */
function recorded(): Promise<ProvidedMachine[]> {
  return providedMachines(bmdb.db, EQUINIX_PROVIDER);
}

/** Agent public keys (hex) of the Equinix machines with AgentStarted, by machine ID. */
async function agentStarts(): Promise<Map<string, string>> {
  const { rows } = await db.admin(
    `SELECT a.machine_id, a.agent_public_key FROM machine_agent_started a
     JOIN machine_provided p USING (machine_id) WHERE p.provider = $1`,
    [EQUINIX_PROVIDER],
  );
  return new Map(
    rows.map((row: { machine_id: string; agent_public_key: Buffer }) => [
      row.machine_id,
      row.agent_public_key.toString('hex'),
    ]),
  );
}

function publicIpv4(device: EquinixDevice | undefined): string | undefined {
  return device?.ip_addresses?.find((ip) => ip.public && ip.address_family === 4)?.address;
}

/** The devices of the fake sitting on `reservationId`. */
function devicesOn(api: FakeEquinixApi, reservationId: string): EquinixDevice[] {
  return api.devices.filter((device) => refId(device.hardware_reservation) === reservationId);
}

function createdOn(api: FakeEquinixApi): unknown[] {
  return api
    .requestsTo(CREATE)
    .map((request) => (request.body as { hardware_reservation_id?: unknown }).hardware_reservation_id);
}

/** A provisioning pass's refusal, for a look at what it names. */
async function refusal(attempt: Promise<unknown>): Promise<ProviderDiscrepancyError> {
  const error = await attempt.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ProviderDiscrepancyError);
  return error as ProviderDiscrepancyError;
}

// One story, as the original's smoke tests: each test takes the fleet the one before left.
describe('the shepherd on a fake Equinix project', () => {
  let api: FakeEquinixApi;
  let provider: EquinixProvider;
  const ssh = new FakeSshClient();
  const agentExecutable = new TextEncoder().encode("beep boop i'm a real program");
  let initializer: Initializer;
  /** The 10 machines as the BMDB first recorded them. */
  let fleet: ProvidedMachine[];

  beforeAll(async () => {
    // More reservations than the limit; a reservation listing per pass, so freed ones show at once.
    ({ api, provider } = await fakeProject(14, { reservationCacheTimeout: 0 }));
    initializer = new Initializer(provider, {
      agentExecutable,
      agentEndpoint: 'bmaas.example.com:443',
      sshClient: ssh,
      sshConnectTimeout: 1_000,
      sshExecTimeout: 1_000,
    });
  });

  test('the provisioner brings exactly 10 machines in, 4 per pass, each recorded with its device', async () => {
    const provisioner = new Provisioner(provider, { maxCount: 10, chunkSize: 4, ...fastLimiters() });
    // Every pass lists the project's devices once (lookups of lost creations filter by tag).
    const passes = () =>
      api.requestsTo('GET /projects/{id}/devices').filter((request) => request.query.tag === undefined).length;
    let passesAtTen = 0;
    await runUntil(
      (signal) => provisioner.run(bmdb, { signal }),
      async () => {
        if (passesAtTen === 0 && (await recorded()).length >= 10) passesAtTen = passes();
        // Three passes more: at the limit, it must create nothing.
        return passesAtTen > 0 && passes() >= passesAtTen + 3;
      },
      { what: 'provisioning 10 machines' },
    );

    // Creations per pass, from the fake's request log.
    const perPass: number[] = [];
    for (const request of api.requests) {
      if (request.route === 'GET /projects/{id}/devices' && request.query.tag === undefined) perPass.push(0);
      else if (request.route === CREATE) perPass[perPass.length - 1] = (perPass.at(-1) ?? 0) + 1;
    }
    expect(perPass.slice(0, 3)).toEqual([4, 4, 2]);
    expect(perPass.length).toBeGreaterThanOrEqual(6);
    expect(perPass.slice(3).every((n) => n === 0)).toBe(true);

    const devices = api.devices;
    expect(devices).toHaveLength(10);
    expect(api.requestsTo(CREATE)).toHaveLength(10);
    fleet = await recorded();
    expect(fleet).toHaveLength(10);
    expect(new Set(fleet.map((m) => m.providerId))).toEqual(new Set(devices.map((d) => d.id)));
    for (const machine of fleet) {
      const device = api.device(machine.providerId);
      const reservationId = refId(device?.hardware_reservation);
      expect(machine.provider).toBe('Equinix');
      expect(reservationId).toMatch(/^[0-9a-f-]{36}$/);
      expect(device?.hostname).toBe(PREFIX + reservationId?.slice(0, 18));
      expect(machine.providerReservationId).toBe(reservationId);
    }
    expect(new Set(fleet.map((m) => m.providerReservationId)).size).toBe(10);
    // Each create asked for the reservation's own hostname, plan and OS, with the shepherd's key only.
    const [keyId] = api.sshKeys.filter((key) => key.label === 'shepherd').map((key) => key.id);
    for (const request of api.requestsTo(CREATE)) {
      const body = request.body as Record<string, unknown>;
      expect(body).toMatchObject({
        hostname: PREFIX + String(body.hardware_reservation_id).slice(0, 18),
        plan: 'm3.large.x86',
        operating_system: 'ubuntu_22_04',
        project_ssh_keys: [keyId],
      });
    }
    expect(api.reservations.filter((r) => r.provisionable && !r.device)).toHaveLength(4);
  });

  test('the initializer starts the agent on all 10 through the fake SSH client, at their public IPv4s', async () => {
    // Equinix finished provisioning them: active, with addresses.
    for (const device of api.devices) api.activate(device.id);
    await runUntil(
      (signal) => initializer.run(bmdb, loopOptions(signal)),
      async () => (await agentStarts()).size === 10,
      { what: 'starting 10 agents' },
    );

    const keys = await agentStarts();
    expect([...keys.keys()].sort()).toEqual(fleet.map((m) => m.machineId).sort());
    for (const key of keys.values()) expect(key).toHaveLength(64);
    expect(new Set(keys.values()).size).toBe(10);
    // One dial per machine, each to the public IPv4 of that machine's own device.
    expect(ssh.dials).toHaveLength(10);
    const deviceOf = new Map(fleet.map((m) => [m.machineId, m.providerId]));
    for (const target of ssh.dials) {
      expect(target.port).toBe(22);
      const ipv4 = publicIpv4(api.device(deviceOf.get(target.machineId ?? '') ?? ''));
      expect(ipv4).toMatch(/^198\.1[89]\.\d+\.\d+$/);
      expect(target.host).toBe(ipv4);
    }
    expect(new Set(ssh.dials.map((t) => t.host))).toEqual(new Set(api.devices.map(publicIpv4)));
    expect(ssh.uploads.map((u) => u.path)).toEqual(Array(10).fill('/root/agent'));
    expect(ssh.uploads.every((u) => Buffer.from(u.data).equals(Buffer.from(agentExecutable)))).toBe(true);
    expect(ssh.openConnections).toBe(0);
  });

  test('the recoverer power-cycles (reboots) exactly the silent machine, once, and the initializer starts it again', async () => {
    const [silent, healthy] = fleet as [ProvidedMachine, ProvidedMachine];
    // Both started 10 h ago; only the healthy one has heartbeated since.
    await db.admin(
      "UPDATE machine_agent_started SET agent_started_at = now() - interval '10 hours' WHERE machine_id = ANY($1)",
      [[silent.machineId, healthy.machineId]],
    );
    await db.admin('INSERT INTO machine_agent_heartbeat VALUES ($1, now())', [healthy.machineId]);
    const keyBefore = (await agentStarts()).get(silent.machineId);
    expect(api.requestsTo(ACTIONS)).toEqual([]);

    await runUntil(
      (signal) => new Recoverer(new EquinixPower(fastClient(api))).run(bmdb, loopOptions(signal)),
      async () => !(await agentStarts()).has(silent.machineId),
      { what: 'recovering the silent machine' },
    );
    const reboots = api.requestsTo(ACTIONS);
    expect(reboots).toHaveLength(1);
    expect(reboots[0]).toMatchObject({ path: `/devices/${silent.providerId}/actions`, body: { type: 'reboot' } });
    expect(api.reboots(silent.providerId)).toBe(1);
    expect(api.reboots(healthy.providerId)).toBe(0);
    // Its tags are gone; the healthy one keeps its own.
    const started = await agentStarts();
    expect(started.size).toBe(9);
    expect(started.has(healthy.machineId)).toBe(true);
    const heartbeats = await db.admin('SELECT machine_id FROM machine_agent_heartbeat');
    expect(heartbeats.rows).toEqual([{ machine_id: healthy.machineId }]);
    const history = await workHistory(bmdb.db, silent.machineId);
    expect(history.map((h) => `${h.process}:${h.event}`)).toEqual([
      'ShepherdAgentStart:Started',
      'ShepherdAgentStart:Finished',
      'ShepherdRecovery:Started',
      'ShepherdRecovery:Finished',
    ]);

    const dialsBefore = ssh.dials.length;
    await runUntil(
      (signal) => initializer.run(bmdb, loopOptions(signal)),
      async () => (await agentStarts()).size === 10,
      { what: 'restarting the agent' },
    );
    expect(ssh.dials.slice(dialsBefore)).toEqual([
      expect.objectContaining({ host: publicIpv4(api.device(silent.providerId)), machineId: silent.machineId }),
    ]);
    expect((await agentStarts()).get(silent.machineId)).not.toBe(keyBefore);
    expect(api.requestsTo(ACTIONS)).toHaveLength(1); // still exactly one reboot
  });

  test('the status updater fills status, address, location and reservation; failed and deleted devices show', async () => {
    // Forget what creation recorded, so every field below comes from the updater.
    await db.admin(
      `UPDATE machine_provided SET provider_status = NULL, provider_ip_address = NULL,
         provider_location = NULL, provider_reservation_id = NULL WHERE provider = $1`,
      [EQUINIX_PROVIDER],
    );
    const updater = new EquinixStatusUpdater({ client: fastClient(api), projectId: api.projectId });
    const session = await bmdb.startSession();
    try {
      expect(await updater.syncOnce(session)).toMatchObject({ machines: 10, checked: 10, updated: 10, missing: 0 });
      for (const machine of await recorded()) {
        const device = api.device(machine.providerId);
        expect(machine).toMatchObject({
          providerStatus: ProviderStatus.Running,
          providerIpAddress: publicIpv4(device),
          providerLocation: 'da11',
          providerReservationId: refId(device?.hardware_reservation),
        });
        expect(machine.providerIpAddress).toMatch(/^198\./);
      }

      const [, , failing, deleted] = fleet as [ProvidedMachine, ProvidedMachine, ProvidedMachine, ProvidedMachine];
      api.setDeviceState(failing.providerId, 'failed');
      api.removeDevice(deleted.providerId);
      expect(await updater.syncOnce(session, { all: true })).toMatchObject({ checked: 10, updated: 2, missing: 1 });
      const after = new Map((await recorded()).map((m) => [m.providerId, m]));
      expect(after.get(failing.providerId)?.providerStatus).toBe(ProviderStatus.ProvisioningFailedPermanent);
      expect(after.get(deleted.providerId)?.providerStatus).toBe(ProviderStatus.Missing);
      const others = [...after.values()].filter(
        (m) => m !== after.get(failing.providerId) && m !== after.get(deleted.providerId),
      );
      expect(others.map((m) => m.providerStatus)).toEqual(Array(8).fill(ProviderStatus.Running));
    } finally {
      await session.close();
    }
  });

  test('a deleted device stops the provisioner until it leaves the BMDB; a failed one still counts as managed', async () => {
    const [, , failing, deleted] = fleet as [ProvidedMachine, ProvidedMachine, ProvidedMachine, ProvidedMachine];
    const provisioner = new Provisioner(provider, { maxCount: 10, chunkSize: 4, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      const error = await refusal(provisioner.reconcile(session));
      expect(error.missingFromProvider).toEqual([deleted.providerId]);
      expect(error.missingFromBMDB).toEqual([]);
      expect(error.message).toContain(deleted.providerId);
      expect(error.message).not.toContain(failing.providerId);
      expect(api.requestsTo(CREATE)).toHaveLength(10);

      // The operator takes the deleted machine out of the BMDB. Its reservation is free again,
      // and so are four others, but the failed device holds its place under the limit: one creation.
      await db.admin('DELETE FROM machines WHERE machine_id = $1', [deleted.machineId]);
      const report = await provisioner.reconcile(session);
      expect(report).toMatchObject({ managed: 9, available: 5, failed: [] });
      expect(report.created).toHaveLength(1);
      expect(api.devices).toHaveLength(10);
      expect(await recorded()).toHaveLength(10);
    } finally {
      await session.close();
    }
  });
});

describe('orphans through the provisioner', () => {
  beforeEach(async () => {
    await db.admin('DELETE FROM machines');
  });

  test('a device created on a reservation but never recorded (a crash) is adopted, not duplicated', async () => {
    const { api, provider } = await fakeProject(3);
    const [orphanReservation] = api.reservations;
    const reservationId = orphanReservation?.id ?? '';
    // What a shepherd that died between Equinix's answer and the BMDB write leaves behind.
    const orphan = api.addDevice({ hostname: PREFIX + reservationId.slice(0, 18), reservationId });

    const provisioner = new Provisioner(provider, { maxCount: 2, chunkSize: 2, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      const report = await provisioner.reconcile(session);
      expect(report.failed).toEqual([]);
      // The adoption counts against the limit like a creation: one adopted, one created.
      expect(report.created).toHaveLength(2);
      expect(report.created[0]).toBe(orphan.id);
      expect(devicesOn(api, reservationId)).toEqual([expect.objectContaining({ id: orphan.id })]);
      expect(createdOn(api)).toHaveLength(1);
      expect(createdOn(api)).not.toContain(reservationId);
      expect(api.devices).toHaveLength(2);
      const machines = new Map((await recorded()).map((m) => [m.providerId, m]));
      expect(machines.size).toBe(2);
      expect(machines.get(orphan.id)).toMatchObject({ provider: 'Equinix', providerReservationId: reservationId });

      // Settled: the next pass manages both and refuses nothing.
      expect(await provisioner.reconcile(session)).toEqual({
        managed: 2,
        available: 1,
        created: [],
        failed: [],
        bootMethodsChanged: 0,
        retired: [],
        forgotten: [],
      });
    } finally {
      await session.close();
    }
  });

  test('a device whose BMDB write failed after the API created it is adopted by the next pass', async () => {
    const { api, provider } = await fakeProject(2);
    await db.admin(`
      CREATE FUNCTION refuse_provided() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'injected: machine_provided is read-only'; END $$;
      CREATE TRIGGER refuse_provided BEFORE INSERT ON machine_provided
        FOR EACH ROW EXECUTE FUNCTION refuse_provided();`);
    const provisioner = new Provisioner(provider, { maxCount: 1, chunkSize: 1, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      const first = await provisioner.reconcile(session);
      expect(first.created).toEqual([]);
      expect(first.failed).toHaveLength(1);
      const error = first.failed[0]?.error;
      expect(error).toBeInstanceOf(DeviceNotRecordedError);
      expect(String(error)).toContain('injected: machine_provided is read-only');
      expect(api.devices).toHaveLength(1);
      const [device] = api.devices as [EquinixDevice];
      expect((error as DeviceNotRecordedError).deviceId).toBe(device.id);
      expect(await recorded()).toEqual([]);

      await db.admin('DROP TRIGGER refuse_provided ON machine_provided; DROP FUNCTION refuse_provided();');
      const second = await provisioner.reconcile(session);
      expect(second).toMatchObject({ managed: 0, created: [device.id], failed: [] });
      expect(api.devices).toHaveLength(1); // adopted, not created again, and the limit of 1 holds
      expect(api.requestsTo(CREATE)).toHaveLength(1);
      expect(await recorded()).toEqual([
        expect.objectContaining({ providerId: device.id, providerReservationId: refId(device.hardware_reservation) }),
      ]);
      expect(await provisioner.reconcile(session)).toMatchObject({ managed: 1, created: [], failed: [] });
    } finally {
      await session.close();
      await db.admin(
        'DROP TRIGGER IF EXISTS refuse_provided ON machine_provided; DROP FUNCTION IF EXISTS refuse_provided();',
      );
    }
  });

  test('a prefixed device the shepherd did not create makes the provisioner refuse, naming it', async () => {
    const { api, provider } = await fakeProject(3);
    const [taken] = api.reservations;
    // Prefixed, but on no reservation; and prefixed on a reservation under another name.
    const handmade = api.addDevice({ hostname: `${PREFIX}handmade` });
    const renamed = api.addDevice({ hostname: `${PREFIX}renamed`, reservationId: taken?.id ?? '' });

    const provisioner = new Provisioner(provider, { maxCount: 5, chunkSize: 5, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      const error = await refusal(provisioner.reconcile(session));
      expect([...error.missingFromBMDB].sort()).toEqual([handmade.id, renamed.id].sort());
      expect(error.missingFromProvider).toEqual([]);
      expect(error.message).toContain(handmade.id);
      expect(error.message).toContain(renamed.id);
      expect(api.requestsTo(CREATE)).toEqual([]);
      expect(await recorded()).toEqual([]);

      // Once the operator removed them, provisioning goes on: on the two free reservations (the
      // one the renamed device held shows once the 15 min reservation cache runs out).
      api.removeDevice(handmade.id);
      api.removeDevice(renamed.id);
      const report = await provisioner.reconcile(session);
      expect(report.created).toHaveLength(2);
      expect(report.failed).toEqual([]);
      expect(createdOn(api)).not.toContain(taken?.id);
    } finally {
      await session.close();
    }
  });

  test('a session that expires during a creation ends the pass; the one unrecorded device is adopted next', async () => {
    const { api, provider } = await fakeProject(4);
    const session = await bmdb.startSession();
    // The BMDB out of reach for longer than the session interval while a device is being created.
    const expiring: Provider = {
      type: provider.type,
      listMachines: (signal) => provider.listMachines(signal),
      getMachine: (id, signal) => provider.getMachine(id, signal),
      createMachine: async (using, request, signal) => {
        await db.admin("UPDATE sessions SET deadline = now() - interval '1 minute' WHERE session_id = $1", [
          session.id,
        ]);
        return provider.createMachine(using, request, signal);
      },
    };
    try {
      await expect(
        new Provisioner(expiring, { maxCount: 3, chunkSize: 3, ...fastLimiters() }).reconcile(session),
      ).rejects.toBeInstanceOf(SessionExpiredError);
      // One device in flight when it expired, not one per slot of the chunk.
      expect(api.devices).toHaveLength(1);
      expect(await recorded()).toEqual([]);
    } finally {
      await session.close();
    }
    const [orphan] = api.devices as [EquinixDevice];

    const next = await bmdb.startSession();
    try {
      const report = await new Provisioner(provider, { maxCount: 3, chunkSize: 3, ...fastLimiters() }).reconcile(next);
      expect(report.failed).toEqual([]);
      expect(report.created).toHaveLength(3);
      expect(report.created[0]).toBe(orphan.id);
      expect(api.requestsTo(CREATE)).toHaveLength(3);
      expect(await recorded()).toHaveLength(3);
      const reservations = api.devices.map((device) => refId(device.hardware_reservation));
      expect(new Set(reservations).size).toBe(3);
    } finally {
      await next.close();
    }
  });
});

describe('idempotent creation through the provisioner', () => {
  beforeEach(async () => {
    await db.admin('DELETE FROM machines');
  });

  test.each<[string, FakeFault]>([
    ['its answer is lost (connection cut)', { drop: true }],
    ['the API answers 502 after creating it', { status: 502, afterProcessing: true }],
    ['its answer is garbled', { malformed: true }],
  ])('a create whose device exists but %s ends with exactly one device', async (_, fault) => {
    const { api, provider } = await fakeProject(2);
    api.fail(CREATE, fault);
    const provisioner = new Provisioner(provider, { maxCount: 1, chunkSize: 1, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      const report = await provisioner.reconcile(session);
      expect(report.failed).toEqual([]);
      expect(api.devices).toHaveLength(1);
      const [device] = api.devices as [EquinixDevice];
      expect(report.created).toEqual([device.id]);
      const [reservationId] = createdOn(api);
      expect(devicesOn(api, String(reservationId))).toEqual([expect.objectContaining({ id: device.id })]);
      // The client found the device by its creation tag instead of creating a second one.
      expect(api.requestsTo(CREATE)).toHaveLength(1);
      expect(api.requestsTo('GET /projects/{id}/devices').some((request) => request.query.tag !== undefined)).toBe(
        true,
      );
      expect(await recorded()).toEqual([
        expect.objectContaining({ providerId: device.id, providerReservationId: reservationId }),
      ]);
      expect(await provisioner.reconcile(session)).toMatchObject({ managed: 1, created: [], failed: [] });
      expect(api.devices).toHaveLength(1);
    } finally {
      await session.close();
    }
  });
});
