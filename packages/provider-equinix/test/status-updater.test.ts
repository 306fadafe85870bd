import type { Session } from '@bmaas/bmdb-controlloop';
import { addProvided, newMachine, ProviderStatus, providedMachines } from '@bmaas/bmdb-model';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { EQUINIX_PROVIDER, EquinixStatusUpdater } from '../src/index.js';
import { providerStatusForState } from '../src/provider/device-facts.js';
import { FakeEquinixApi } from '../src/testing/index.js';
import { fastClient } from './helpers.js';

let session: Session;
let api: FakeEquinixApi;

const { bmdb } = await testBMDB();

beforeAll(async () => {
  session = await bmdb.startSession({ processor: 'status-test' });
});
beforeEach(async () => {
  await bmdb.db.deleteFrom('machine_provided').execute();
  await bmdb.db.deleteFrom('machines').execute();
  api = await FakeEquinixApi.start({ provisioningReads: Number.POSITIVE_INFINITY });
  return () => api.close();
});
afterAll(() => session.close());

function updater(options: { pollInterval?: number } = {}): EquinixStatusUpdater {
  return new EquinixStatusUpdater({ client: fastClient(api, { pageSize: 4 }), projectId: api.projectId, ...options });
}

/** Records a device in the BMDB as the provider would, with nothing known yet but its ID. */
async function record(deviceId: string): Promise<string> {
  return session.transact(async (q) => {
    const machineId = await newMachine(q);
    await addProvided(q, machineId, { provider: EQUINIX_PROVIDER, providerId: deviceId });
    return machineId;
  });
}

async function rows() {
  const machines = await session.transact((q) => providedMachines(q, EQUINIX_PROVIDER));
  return new Map(machines.map((m) => [m.providerId, m]));
}

describe('status mapping', () => {
  it.each([
    ['active', ProviderStatus.Running],
    ['deleted', ProviderStatus.Missing],
    ['failed', ProviderStatus.ProvisioningFailedPermanent],
    ['inactive', ProviderStatus.Stopped],
    ['powering_on', ProviderStatus.Stopped],
    ['powering_off', ProviderStatus.Stopped],
    ['queued', ProviderStatus.Provisioning],
    ['provisioning', ProviderStatus.Provisioning],
    ['reinstalling', ProviderStatus.Provisioning],
    ['post_provisioning', ProviderStatus.Provisioning],
    ['migrating', ProviderStatus.Unknown],
  ])('maps %s to %s', (state, status) => {
    expect(providerStatusForState(state)).toBe(status);
  });
});

describe('EquinixStatusUpdater.syncOnce', () => {
  it('records status, address, location and reservation of every machine', async () => {
    const reservation = api.addReservation();
    const active = api.addDevice({ hostname: 'active', reservationId: reservation.id });
    const metroOnly = api.addDevice({ hostname: 'metro-only', facility: null, metro: 'sv' });
    const provisioning = api.addDevice({ hostname: 'provisioning', state: 'provisioning' });
    const inactive = api.addDevice({ hostname: 'inactive', state: 'inactive' });
    const failed = api.addDevice({ hostname: 'failed', state: 'failed', ipv4: null, ipv6: null });
    const odd = api.addDevice({ hostname: 'odd', state: 'migrating' });
    const gone = api.addDevice({ hostname: 'gone' });
    for (const device of [active, metroOnly, provisioning, inactive, failed, odd, gone]) await record(device.id);
    api.removeDevice(gone.id);

    const report = await updater().syncOnce(session);

    expect(report).toEqual({ machines: 7, checked: 7, updated: 7, missing: 1, fetch: 'list' });
    const byDevice = await rows();
    const v4 = (id: string) =>
      api.device(id)?.ip_addresses?.find((ip) => ip.public && ip.address_family === 4)?.address;
    expect(byDevice.get(active.id)).toMatchObject({
      providerStatus: ProviderStatus.Running,
      providerIpAddress: v4(active.id),
      providerLocation: 'da11',
      providerReservationId: reservation.id,
    });
    expect(byDevice.get(metroOnly.id)).toMatchObject({ providerLocation: 'sv' });
    expect(byDevice.get(provisioning.id)).toMatchObject({
      providerStatus: ProviderStatus.Provisioning,
      providerIpAddress: null,
    });
    expect(byDevice.get(inactive.id)?.providerStatus).toBe(ProviderStatus.Stopped);
    expect(byDevice.get(failed.id)?.providerStatus).toBe(ProviderStatus.ProvisioningFailedPermanent);
    expect(byDevice.get(odd.id)?.providerStatus).toBe(ProviderStatus.Unknown);
    expect(byDevice.get(gone.id)?.providerStatus).toBe(ProviderStatus.Missing);
    // The vanished device was confirmed with a GET (404), the others came from the listing.
    expect(api.requestsTo('GET /devices/{id}').map((r) => r.path)).toEqual([`/devices/${gone.id}`]);
  });

  it('rechecks settling machines every pass and settled ones only later', async () => {
    const settled = api.addDevice({ hostname: 'settled' });
    const settling = api.addDevice({ hostname: 'settling', state: 'provisioning' });
    const booting = api.addDevice({ hostname: 'booting', state: 'powering_on' });
    for (const device of [settled, settling, booting]) await record(device.id);
    const statusUpdater = updater();

    await statusUpdater.syncOnce(session);
    const second = await statusUpdater.syncOnce(session);
    expect(second).toMatchObject({ checked: 2, updated: 0 });

    api.activate(settling.id);
    const third = await statusUpdater.syncOnce(session);
    expect(third).toMatchObject({ checked: 2, updated: 1 });
    expect((await rows()).get(settling.id)).toMatchObject({
      providerStatus: ProviderStatus.Running,
      providerIpAddress: expect.stringMatching(/^198\./),
    });

    const fourth = await statusUpdater.syncOnce(session);
    expect(fourth).toMatchObject({ checked: 1 });
    expect(await statusUpdater.syncOnce(session, { all: true })).toMatchObject({ checked: 3, updated: 0 });
  });

  it('lists in bulk when many machines are due and GETs one by one when few are', async () => {
    const devices = Array.from({ length: 10 }, (_, i) =>
      api.addDevice({ hostname: `bulk-${i}`, state: i === 0 ? 'provisioning' : 'active' }),
    );
    for (const device of devices) await record(device.id);
    const statusUpdater = updater();

    const first = await statusUpdater.syncOnce(session);
    expect(first.fetch).toBe('list');
    expect(api.requestsTo('GET /projects/{id}/devices')).toHaveLength(3);
    expect(api.requestsTo('GET /devices/{id}')).toHaveLength(0);

    const second = await statusUpdater.syncOnce(session);
    expect(second).toMatchObject({ fetch: 'get', checked: 1 });
    expect(api.requestsTo('GET /projects/{id}/devices')).toHaveLength(3);
    expect(api.requestsTo('GET /devices/{id}').map((r) => r.path)).toEqual([`/devices/${devices[0]?.id}`]);
  });

  it('marks a device the API no longer knows as Missing when checked on its own', async () => {
    const device = api.addDevice({ hostname: 'short-lived', state: 'provisioning' });
    await record(device.id);
    const statusUpdater = updater();
    await statusUpdater.syncOnce(session);
    api.removeDevice(device.id);

    const report = await statusUpdater.syncOnce(session);

    expect(report).toMatchObject({ fetch: 'get', missing: 1, updated: 1 });
    expect((await rows()).get(device.id)?.providerStatus).toBe(ProviderStatus.Missing);
  });

  it('leaves a machine due when its check fails, and catches up next pass', async () => {
    const device = api.addDevice({ hostname: 'flaky', state: 'provisioning' });
    await record(device.id);
    const statusUpdater = updater();
    await statusUpdater.syncOnce(session);
    api.activate(device.id);
    api.fail('GET /devices/{id}', { status: 403 });

    expect(await statusUpdater.syncOnce(session)).toMatchObject({ checked: 0, updated: 0 });
    expect(await statusUpdater.syncOnce(session)).toMatchObject({ checked: 1, updated: 1 });
  });
});

describe('EquinixStatusUpdater.run', () => {
  it('keeps the BMDB current until stopped, survives failed passes, and closes its session', async () => {
    const device = api.addDevice({ hostname: 'running', state: 'provisioning' });
    await record(device.id);
    const sessions = async () =>
      Number(
        (
          await bmdb.db
            .selectFrom('sessions')
            .select((eb) => eb.fn.countAll().as('n'))
            .executeTakeFirstOrThrow()
        ).n,
      );
    const before = await sessions();
    api.fail('GET /projects/{id}/devices', { status: 500, times: 6 });
    const controller = new AbortController();

    const running = updater({ pollInterval: 10 }).run(bmdb, { signal: controller.signal });
    await expect.poll(async () => (await rows()).get(device.id)?.providerStatus).toBe(ProviderStatus.Provisioning);
    api.activate(device.id);
    await expect.poll(async () => (await rows()).get(device.id)?.providerStatus).toBe(ProviderStatus.Running);
    controller.abort();
    await running;

    expect(await sessions()).toBe(before);
  });
});
