import type { Session } from '@bmaas/bmdb-controlloop';
import { ProviderStatus, providedMachines } from '@bmaas/bmdb-model';
import { Availability, type Machine, MachineNotFoundError } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { CREATE_TAG_PREFIX } from '../src/api/client.js';
import {
  DeviceNotAdoptableError,
  DeviceNotRecordedError,
  EQUINIX_PROVIDER,
  type EquinixMachine,
  EquinixProvider,
  type EquinixProviderOptions,
  ReservationTakenError,
  ReservationUnavailableError,
} from '../src/index.js';
import { FakeEquinixApi } from '../src/testing/index.js';
import { fastClient } from './helpers.js';

const PREFIX = 'shep-';
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFc0gXoIKZ7PSJtVk0V1YeZ0m3c0p3dTk0lIFOgM3Ol5 shepherd@test';
const OTHER_KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBcL3ZsXfGqJ8p3pS8l0xYd1oEw6M0C2n1G2vZf0YkQ9 someone@else';

let session: Session;
const fakes: FakeEquinixApi[] = [];

const { bmdb } = await testBMDB();

beforeAll(async () => {
  session = await bmdb.startSession({ processor: 'provider-test' });
});
afterAll(async () => {
  await Promise.all(fakes.map((fake) => fake.close()));
});

async function setup(
  options: { reservations?: number; provider?: Partial<EquinixProviderOptions> } = {},
): Promise<{ api: FakeEquinixApi; provider: EquinixProvider }> {
  const api = await FakeEquinixApi.start({ reservations: options.reservations ?? 0 });
  fakes.push(api);
  const provider = new EquinixProvider({
    client: fastClient(api),
    projectId: api.projectId,
    devicePrefix: PREFIX,
    os: 'ubuntu_22_04',
    sshKeyLabel: 'shepherd',
    sshPublicKey: KEY,
    ...options.provider,
  });
  return { api, provider };
}

/** The BMDB's Equinix machines, by provider ID. */
async function recorded(): Promise<Map<string, Awaited<ReturnType<typeof equinixMachines>>[number]>> {
  return new Map((await equinixMachines()).map((m) => [m.providerId, m]));
}

function equinixMachines() {
  return session.transact((q) => providedMachines(q, EQUINIX_PROVIDER));
}

/** What the provisioner does with PossiblyUsed: known to the BMDB → used, else unused (a spread copy). */
async function resolveAsProvisioner(machines: readonly Machine[]): Promise<Machine[]> {
  const inBMDB = await recorded();
  return machines.map((machine) =>
    machine.availability === Availability.PossiblyUsed
      ? {
          ...machine,
          availability:
            machine.id !== undefined && inBMDB.has(machine.id) ? Availability.KnownUsed : Availability.KnownUnused,
        }
      : machine,
  );
}

function ownHostname(reservationId: string): string {
  return PREFIX + reservationId.slice(0, 18);
}

describe('listMachines', () => {
  it('lists prefixed devices as in use and free reservations as capacity', async () => {
    const { api, provider } = await setup({ reservations: 2 });
    const [free1, free2] = api.reservations;
    const mine = api.addReservation();
    const taken = api.addReservation();
    api.addReservation({ provisionable: false });
    const own = api.addDevice({ hostname: ownHostname(mine.id), reservationId: mine.id });
    const failed = api.addDevice({ hostname: `${PREFIX}failed`, state: 'failed' });
    const manual = api.addDevice({ hostname: `${PREFIX}manual` });
    api.addDevice({ hostname: 'not-ours', reservationId: taken.id });

    const machines = await provider.listMachines();

    const byId = new Map(machines.map((m) => [m.id ?? m.reservationId, m]));
    expect(machines).toHaveLength(5);
    expect(byId.get(own.id)).toMatchObject({
      availability: Availability.PossiblyUsed,
      failed: false,
      agentBoot: 'ssh',
      macs: [],
      address: own.ip_addresses?.find((ip) => ip.public && ip.address_family === 4)?.address,
      reservationId: mine.id,
      hostname: own.hostname,
      state: 'active',
    });
    expect(byId.get(failed.id)).toMatchObject({ availability: Availability.KnownUsed, failed: true });
    expect(byId.get(manual.id)).toMatchObject({ availability: Availability.KnownUsed, failed: false });
    for (const reservation of [free1, free2]) {
      expect(byId.get(reservation?.id ?? '')).toEqual({
        id: undefined,
        address: undefined,
        availability: Availability.KnownUnused,
        failed: false,
        agentBoot: 'ssh',
        macs: [],
        reservationId: reservation?.id,
        hostname: undefined,
        state: undefined,
      });
    }
  });

  it('gives the public IPv6 address when a device has no public IPv4, and none without either', async () => {
    const { api, provider } = await setup();
    const v6 = api.addDevice({ hostname: `${PREFIX}v6`, ipv4: null, ipv6: '2001:db8::42' });
    const none = api.addDevice({ hostname: `${PREFIX}none`, ipv4: null, ipv6: null });
    expect((await provider.getMachine(v6.id)).address).toBe('2001:db8::42');
    expect((await provider.getMachine(none.id)).address).toBeUndefined();
  });

  it('gets one machine, and reports an unknown one as MachineNotFoundError', async () => {
    const { api, provider } = await setup();
    const device = api.addDevice({ hostname: `${PREFIX}one` });
    await expect(provider.getMachine(device.id)).resolves.toMatchObject({ id: device.id });
    const error = await provider.getMachine('00000000-0000-4000-8000-000000000000').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(MachineNotFoundError);
    expect((error as Error).message).toContain('00000000-0000-4000-8000-000000000000');
  });
});

describe('createMachine', () => {
  it('creates a device on the reservation and records it in the BMDB', async () => {
    const { api, provider } = await setup({ reservations: 1, provider: { tags: ['bmaas', 'fleet-a'] } });
    const [capacity] = await provider.listMachines();
    const reservationId = api.reservations[0]?.id ?? '';

    const machine = await provider.createMachine(session, { unusedMachine: capacity as Machine });

    const devices = api.devices;
    expect(devices).toHaveLength(1);
    const device = devices[0];
    expect(device?.hostname).toBe(ownHostname(reservationId));
    expect(machine).toMatchObject({ id: device?.id, availability: Availability.KnownUsed, reservationId });
    const body = api.requestsTo('POST /projects/{id}/devices')[0]?.body as Record<string, unknown>;
    expect(body).toMatchObject({
      hostname: ownHostname(reservationId),
      plan: 'm3.large.x86',
      operating_system: 'ubuntu_22_04',
      hardware_reservation_id: reservationId,
      project_ssh_keys: [api.sshKeys[0]?.id],
    });
    expect(body.tags).toEqual(['bmaas', 'fleet-a', expect.stringMatching(new RegExp(`^${CREATE_TAG_PREFIX}`))]);
    expect((await recorded()).get(device?.id ?? '')).toMatchObject({
      provider: 'Equinix',
      providerReservationId: reservationId,
      providerLocation: 'da11',
      providerStatus: ProviderStatus.Provisioning,
      providerIpAddress: null,
    });
  });

  it('adds the shepherd key to the project once, under its label', async () => {
    const { api, provider } = await setup({ reservations: 2 });
    for (const capacity of await provider.listMachines()) {
      await provider.createMachine(session, { unusedMachine: capacity });
    }
    expect(api.sshKeys).toEqual([expect.objectContaining({ label: 'shepherd', key: KEY })]);
    expect(api.requestsTo('POST /projects/{id}/ssh-keys')).toHaveLength(1);
  });

  it('replaces a different key under the label, and leaves the same key with another comment alone', async () => {
    const { api, provider } = await setup();
    const stale = api.addSshKey({ label: 'shepherd', key: OTHER_KEY });
    await expect(provider.ensureSshKey()).resolves.toBe(stale.id);
    expect(api.sshKeys[0]?.key).toBe(KEY);

    const second = await setup();
    const same = second.api.addSshKey({ label: 'shepherd', key: KEY.replace('shepherd@test', 'renamed') });
    await expect(second.provider.ensureSshKey()).resolves.toBe(same.id);
    expect(second.api.requestsTo('PUT /ssh-keys/{id}')).toHaveLength(0);
  });

  it('installs every project key when useProjectKeys is set', async () => {
    const { api, provider } = await setup({ reservations: 1, provider: { useProjectKeys: true } });
    const [capacity] = await provider.listMachines();
    await provider.createMachine(session, { unusedMachine: capacity as Machine });
    const body = api.requestsTo('POST /projects/{id}/devices')[0]?.body as Record<string, unknown>;
    expect(body).not.toHaveProperty('project_ssh_keys');
    // The shepherd still needs its own key in the project to reach the device.
    expect(api.sshKeys.map((k) => k.label)).toEqual(['shepherd']);
  });

  it('refuses a machine that is neither a device nor a reservation', async () => {
    const { provider } = await setup();
    await expect(
      provider.createMachine(session, {
        unusedMachine: {
          id: undefined,
          address: undefined,
          availability: Availability.KnownUnused,
          failed: false,
          agentBoot: 'ssh',
          macs: [],
        },
      }),
    ).rejects.toThrow('neither a device ID nor a reservation ID');
  });

  it('reports a reservation taken by someone else, and penalises it', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    api.addDevice({ hostname: 'someone-else', reservationId: capacity?.reservationId ?? '' });

    const error = await provider
      .createMachine(session, { unusedMachine: capacity as Machine })
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(ReservationTakenError);
    expect((error as ReservationTakenError).reservationId).toBe(capacity?.reservationId);
    expect(api.devices).toHaveLength(1);
  });

  it('penalises a reservation whose creation failed, and neither lists nor tries it again', async () => {
    const { api, provider } = await setup({ reservations: 2 });
    const machines = await provider.listMachines();
    const [bad, good] = machines;
    api.fail('POST /projects/{id}/devices', { status: 400, body: { errors: ['bad request'] } });

    await expect(provider.createMachine(session, { unusedMachine: bad as Machine })).rejects.toThrow('bad request');

    const after = await provider.listMachines();
    expect(after.map((m) => m.reservationId)).toEqual([good?.reservationId]);
    const posts = api.requestsTo('POST /projects/{id}/devices').length;
    const again = await provider.createMachine(session, { unusedMachine: bad as Machine }).catch((e: unknown) => e);
    expect(again).toBeInstanceOf(ReservationUnavailableError);
    expect((again as Error).message).toMatch(new RegExp(`${bad?.reservationId}.*penalised until`));
    expect(api.requestsTo('POST /projects/{id}/devices')).toHaveLength(posts);
  });

  it('does not penalise a reservation when only the SSH key could not be set up', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    api.fail('GET /projects/{id}/ssh-keys', { status: 403 });
    await expect(provider.createMachine(session, { unusedMachine: capacity as Machine })).rejects.toMatchObject({
      status: 403,
    });
    await expect(provider.createMachine(session, { unusedMachine: capacity as Machine })).resolves.toMatchObject({
      availability: Availability.KnownUsed,
    });
  });
});

describe('reservation cache', () => {
  it('lists reservations once per cache period and again after a creation', async () => {
    const { api, provider } = await setup({ reservations: 2 });
    const listings = () => api.requestsTo('GET /projects/{id}/hardware-reservations').length;

    await provider.listMachines();
    await provider.listMachines();
    expect(listings()).toBe(1);

    const capacity = (await provider.listMachines()).find((m) => m.availability === Availability.KnownUnused);
    await provider.createMachine(session, { unusedMachine: capacity as Machine });
    const after = await provider.listMachines();
    expect(listings()).toBe(2);
    expect(after.filter((m) => m.availability === Availability.KnownUnused)).toHaveLength(1);
  });

  it('does not list reservations again for each creation of a batch', async () => {
    const { api, provider } = await setup({ reservations: 3 });
    for (const capacity of await provider.listMachines()) {
      await provider.createMachine(session, { unusedMachine: capacity });
    }
    expect(api.devices).toHaveLength(3);
    expect(api.requestsTo('GET /projects/{id}/hardware-reservations')).toHaveLength(1);
  });

  it('lists reservations every time with a zero cache timeout', async () => {
    const { api, provider } = await setup({ reservations: 1, provider: { reservationCacheTimeout: 0 } });
    await provider.listMachines();
    await provider.listMachines();
    expect(api.requestsTo('GET /projects/{id}/hardware-reservations')).toHaveLength(2);
  });

  it('does not offer a cached reservation that already carries our device', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    const reservationId = capacity?.reservationId ?? '';
    api.addDevice({ hostname: ownHostname(reservationId), reservationId });
    const machines = await provider.listMachines();
    expect(machines.map((m) => m.availability)).toEqual([Availability.PossiblyUsed]);
  });
});

describe('orphan adoption', () => {
  it('adopts a device created but never recorded: one device, one machine', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const reservationId = api.reservations[0]?.id ?? '';
    // The shepherd crashed between creating the device and recording it.
    const orphan = api.addDevice({ hostname: ownHostname(reservationId), reservationId, state: 'provisioning' });

    const listed = await provider.listMachines();
    expect(listed).toEqual([expect.objectContaining({ id: orphan.id, availability: Availability.PossiblyUsed })]);
    const [resolved] = await resolveAsProvisioner(listed);
    expect(resolved?.availability).toBe(Availability.KnownUnused);

    const machine = await provider.createMachine(session, { unusedMachine: resolved as Machine });

    expect(machine).toMatchObject({ id: orphan.id, availability: Availability.KnownUsed });
    expect(api.devices).toHaveLength(1);
    expect(api.requestsTo('POST /projects/{id}/devices')).toHaveLength(0);
    expect((await recorded()).get(orphan.id)).toMatchObject({ providerReservationId: reservationId });
    const [next] = await resolveAsProvisioner(await provider.listMachines());
    expect(next?.availability).toBe(Availability.KnownUsed);
  });

  it('recovers from a BMDB failure right after creation on the next pass', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    const doomed = await bmdb.startSession({ processor: 'doomed' });
    await doomed.close();

    const error = await provider.createMachine(doomed, { unusedMachine: capacity as Machine }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DeviceNotRecordedError);
    const deviceId = api.devices[0]?.id ?? '';
    expect((error as Error).message).toContain(deviceId);

    const [resolved] = await resolveAsProvisioner(await provider.listMachines());
    expect(resolved).toMatchObject({ id: deviceId, availability: Availability.KnownUnused });
    await provider.createMachine(session, { unusedMachine: resolved as Machine });

    expect(api.devices).toHaveLength(1);
    expect(api.requestsTo('POST /projects/{id}/devices')).toHaveLength(1);
    expect([...(await recorded()).keys()]).toContain(deviceId);
  });

  it('adopts its own device when a stale listing sends it to a reservation it already took', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    const reservationId = capacity?.reservationId ?? '';
    const own = api.addDevice({ hostname: ownHostname(reservationId), reservationId });

    const machine = await provider.createMachine(session, { unusedMachine: capacity as Machine });

    expect(machine.id).toBe(own.id);
    expect(api.devices).toHaveLength(1);
    expect((await recorded()).has(own.id)).toBe(true);
  });

  it('records a device only once when asked twice', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const [capacity] = await provider.listMachines();
    const machine = await provider.createMachine(session, { unusedMachine: capacity as Machine });
    api.setDeviceState(machine.id ?? '', 'active');

    await provider.createMachine(session, { unusedMachine: { ...machine, availability: Availability.KnownUnused } });

    const rows = (await equinixMachines()).filter((m) => m.providerId === machine.id);
    expect(rows).toHaveLength(1);
    expect(rows[0]?.providerStatus).toBe(ProviderStatus.Running);
  });

  it('refuses to adopt a prefixed device the shepherd did not create', async () => {
    const { api, provider } = await setup({ reservations: 1 });
    const manual = api.addDevice({ hostname: `${PREFIX}manual` });
    const renamed = api.addDevice({ hostname: `${PREFIX}renamed`, reservationId: api.reservations[0]?.id ?? '' });
    for (const device of [manual, renamed]) {
      const error = await provider
        .createMachine(session, {
          unusedMachine: {
            id: device.id,
            address: undefined,
            availability: Availability.KnownUnused,
            failed: false,
            agentBoot: 'ssh',
            macs: [],
          },
        })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(DeviceNotAdoptableError);
      expect((error as Error).message).toContain(device.id);
    }
    expect((await recorded()).has(manual.id)).toBe(false);
  });
});

describe('settings', () => {
  it('rejects missing settings and a malformed public key', async () => {
    const { provider } = await setup();
    const base = { ...provider.settings, client: fastClient(fakes[0] as FakeEquinixApi), sshPublicKey: KEY };
    expect(() => new EquinixProvider({ ...base, devicePrefix: '' })).toThrow(TypeError);
    expect(() => new EquinixProvider({ ...base, sshPublicKey: 'not a key' })).toThrow(TypeError);
  });

  it('is typed as an EquinixMachine list', async () => {
    const { provider } = await setup({ reservations: 1 });
    const machines: EquinixMachine[] = await provider.listMachines();
    expect(machines[0]?.reservationId).toBeDefined();
  });
});
