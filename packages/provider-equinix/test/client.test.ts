import { parseLimiter, RateLimiter } from '@bmaas/bmdb-controlloop';
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { CREATE_TAG_PREFIX, nextPage } from '../src/api/client.js';
import { parseRetryAfter } from '../src/api/retry.js';
import {
  EquinixApiError,
  EquinixClient,
  EquinixRequestError,
  EquinixResponseError,
  ReservationTakenError,
} from '../src/index.js';
import type { FakeEquinixApi } from '../src/testing/index.js';
import { fastClient, resetFaultsAfterEach, startFake } from './helpers.js';

let api: FakeEquinixApi;
beforeAll(async () => {
  api = await startFake({ reservations: 7 });
});
resetFaultsAfterEach(() => api);

function sshKeyLine(comment = 'shepherd'): string {
  return `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ${comment}`;
}

describe('pagination', () => {
  it('follows meta.next across pages to the last one', async () => {
    const created = Array.from({ length: 10 }, (_, i) => api.addDevice({ hostname: `page-test-${i}` }));
    const client = fastClient(api, { pageSize: 3 });
    const before = api.requestsTo('GET /projects/{id}/devices').length;

    const devices = await client.listDevices(api.projectId);

    const calls = api.requestsTo('GET /projects/{id}/devices').slice(before);
    expect(calls.map((call) => call.query.page)).toEqual(['1', '2', '3', '4']);
    expect(calls.every((call) => call.query.per_page === '3')).toBe(true);
    expect(devices.map((device) => device.id)).toEqual(expect.arrayContaining(created.map((device) => device.id)));
    expect(new Set(devices.map((device) => device.id)).size).toBe(devices.length);
    for (const device of created) api.removeDevice(device.id);
  });

  it('lists every reservation with a page size of one', async () => {
    const client = fastClient(api, { pageSize: 1 });
    const reservations = await client.listReservations(api.projectId);
    expect(reservations.map((r) => r.id).sort()).toEqual(api.reservations.map((r) => r.id).sort());
    expect(reservations.length).toBeGreaterThanOrEqual(7);
  });

  it('reads the next page from meta.next.href or meta.last_page', () => {
    expect(nextPage({ next: { href: '/metal/v1/projects/p/devices?page=5&per_page=2' }, last_page: 9 }, 4)).toBe(5);
    expect(nextPage({ next: { href: '/metal/v1/projects/p/devices' } }, 4)).toBe(5);
    expect(nextPage({ next: null, last_page: 3 }, 2)).toBe(3);
    expect(nextPage({ next: null, last_page: 3 }, 3)).toBeUndefined();
    expect(nextPage({ next: { href: '/x?page=4' }, last_page: 3 }, 3)).toBeUndefined();
    expect(nextPage(undefined, 1)).toBeUndefined();
  });
});

describe('retries', () => {
  it('retries a 500 and then succeeds', async () => {
    const device = api.addDevice({ hostname: 'retry-500' });
    api.fail('GET /devices/{id}', { status: 500, times: 2 });
    const before = api.requestsTo('GET /devices/{id}').length;

    const got = await fastClient(api).getDevice(device.id);

    expect(got.id).toBe(device.id);
    expect(api.requestsTo('GET /devices/{id}').length - before).toBe(3);
  });

  it('retries a 429 after the Retry-After seconds, not the (huge) backoff', async () => {
    const device = api.addDevice({ hostname: 'retry-429' });
    api.fail('GET /devices/{id}', { status: 429, retryAfter: 1 });
    // A backoff of a minute would time the test out: only Retry-After can be at work.
    const client = fastClient(api, { retry: { baseDelay: 60_000, maxDelay: 60_000 } });

    await expect(client.getDevice(device.id)).resolves.toMatchObject({ id: device.id });
  });

  it('retries a 429 after a Retry-After HTTP date', async () => {
    const device = api.addDevice({ hostname: 'retry-429-date' });
    api.fail('GET /devices/{id}', { status: 429, retryAfter: new Date(Date.now() + 500).toUTCString() });
    const client = fastClient(api, { retry: { baseDelay: 60_000, maxDelay: 60_000 } });

    await expect(client.getDevice(device.id)).resolves.toMatchObject({ id: device.id });
  });

  it('parses Retry-After as seconds or HTTP date, and caps it', () => {
    const now = Date.parse('2030-01-01T00:00:00Z');
    expect(parseRetryAfter('3', now)).toBe(3_000);
    expect(parseRetryAfter('Tue, 01 Jan 2030 00:00:10 GMT', now)).toBe(10_000);
    expect(parseRetryAfter('Mon, 31 Dec 2029 00:00:00 GMT', now)).toBe(0);
    expect(parseRetryAfter('soon', now)).toBeUndefined();
    expect(parseRetryAfter(null, now)).toBeUndefined();
  });

  it.each([401, 403, 404, 422])('does not retry HTTP %i', async (status) => {
    const device = api.addDevice({ hostname: `no-retry-${status}` });
    api.fail('GET /devices/{id}', { status, body: { errors: [`nope ${status}`] } });
    const before = api.requestsTo('GET /devices/{id}').length;

    const error = await fastClient(api)
      .getDevice(device.id)
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(EquinixApiError);
    expect(error).toMatchObject({ status, method: 'GET', endpoint: `/devices/${device.id}`, attempts: 1 });
    expect((error as Error).message).toBe(
      `Equinix API GET /devices/${device.id} failed with HTTP ${status}: nope ${status}`,
    );
    expect(api.requestsTo('GET /devices/{id}').length - before).toBe(1);
  });

  it('reads the API message from {"error": "..."} bodies', async () => {
    const client = new EquinixClient({ apiKey: 'wrong-key', baseUrl: api.url, retry: { baseDelay: 1 } });
    const error = await client.getDevice('00000000-0000-0000-0000-000000000000').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EquinixApiError);
    expect((error as EquinixApiError).status).toBe(401);
    expect((error as EquinixApiError).apiMessage).toBe('Invalid authentication token');
  });

  it('gives up after maxAttempts with the last error', async () => {
    const device = api.addDevice({ hostname: 'give-up' });
    api.fail('GET /devices/{id}', { status: 503, times: 3 });
    const error = await fastClient(api, { retry: { maxAttempts: 3 } })
      .getDevice(device.id)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EquinixApiError);
    expect(error).toMatchObject({ status: 503, attempts: 3 });
    expect((error as Error).message).toContain('(after 3 attempts)');
  });

  it('retries a lost answer and a timeout of a GET', async () => {
    const device = api.addDevice({ hostname: 'lost-get' });
    api.fail('GET /devices/{id}', { drop: true });
    api.fail('GET /devices/{id}', { delay: 1_000 });
    const got = await fastClient(api, { requestTimeout: 100 }).getDevice(device.id);
    expect(got.id).toBe(device.id);
  });

  it('reports a timeout as EquinixRequestError once attempts run out', async () => {
    const device = api.addDevice({ hostname: 'timeout' });
    api.fail('GET /devices/{id}', { delay: 1_000, times: 2 });
    const error = await fastClient(api, { requestTimeout: 50, retry: { maxAttempts: 2 } })
      .getDevice(device.id)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EquinixRequestError);
    expect(error).toMatchObject({ timedOut: true, attempts: 2, method: 'GET' });
    expect((error as Error).message).toContain(`GET /devices/${device.id} timed out`);
  });

  it('retries a malformed JSON answer', async () => {
    api.fail('GET /projects/{id}/hardware-reservations', { malformed: true });
    const reservations = await fastClient(api).listReservations(api.projectId);
    expect(reservations.length).toBeGreaterThanOrEqual(7);
  });

  it('reports a malformed answer as EquinixResponseError once attempts run out', async () => {
    api.fail('GET /projects/{id}/hardware-reservations', { malformed: true, times: 2 });
    const error = await fastClient(api, { retry: { maxAttempts: 2 } })
      .listReservations(api.projectId)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EquinixResponseError);
    expect((error as Error).message).toContain(`GET /projects/${api.projectId}/hardware-reservations`);
  });

  it('stops waiting as soon as the caller aborts', async () => {
    const device = api.addDevice({ hostname: 'abort' });
    api.fail('GET /devices/{id}', { status: 500, times: 5 });
    const controller = new AbortController();
    const client = fastClient(api, { retry: { baseDelay: 60_000, maxDelay: 60_000 } });
    const pending = client.getDevice(device.id, controller.signal);
    await vi.waitFor(() => expect(api.requestsTo('GET /devices/{id}').at(-1)?.path).toBe(`/devices/${device.id}`));
    controller.abort(new Error('stopping'));
    await expect(pending).rejects.toThrow('stopping');
  });
});

describe('limits', () => {
  it('keeps at most maxConcurrency requests on the wire', async () => {
    const fake = await startFake();
    const device = fake.addDevice({ hostname: 'busy' });
    fake.fail('GET /devices/{id}', { delay: 30, times: 8 });
    const client = fastClient(fake, { maxConcurrency: 2 });

    await Promise.all(Array.from({ length: 8 }, () => client.getDevice(device.id)));

    expect(fake.maxConcurrentRequests).toBe(2);
  });

  it('takes a rate-limit token for every attempt', async () => {
    const limiter = parseLimiter('1ms,100');
    const wait = vi.spyOn(limiter, 'wait');
    const device = api.addDevice({ hostname: 'limited' });
    api.fail('GET /devices/{id}', { status: 502 });
    const client = fastClient(api, { rateLimiter: limiter });

    await client.getDevice(device.id);
    await client.listReservations(api.projectId);

    expect(wait).toHaveBeenCalledTimes(3);
  });

  it('rejects nonsense settings', () => {
    expect(() => new EquinixClient({ apiKey: '' })).toThrow(TypeError);
    expect(() => new EquinixClient({ apiKey: 'k', baseUrl: 'not a url' })).toThrow(TypeError);
    expect(() => new EquinixClient({ apiKey: 'k', maxConcurrency: 0 })).toThrow(RangeError);
    expect(() => new EquinixClient({ apiKey: 'k', retry: { maxAttempts: 0 } })).toThrow(RangeError);
    expect(() => new EquinixClient({ apiKey: 'k', pageSize: 1.5 })).toThrow(RangeError);
    expect(new EquinixClient({ apiKey: 'k', rateLimiter: new RateLimiter(250, 8) }).settings.rateLimit).toBe('250ms,8');
  });
});

describe('device creation', () => {
  function freeReservation() {
    return api.addReservation();
  }

  function request(reservationId: string, hostname = `create-${reservationId.slice(0, 8)}`) {
    return {
      hostname,
      plan: 'm3.large.x86',
      operating_system: 'ubuntu_22_04',
      hardware_reservation_id: reservationId,
      tags: ['bmaas'],
    };
  }

  function devicesOn(reservationId: string) {
    return api.devices.filter((device) => device.hardware_reservation?.href?.endsWith(reservationId));
  }

  it('creates a device carrying its creation tag', async () => {
    const reservation = freeReservation();
    const device = await fastClient(api).createDevice(api.projectId, request(reservation.id));
    expect(device.state).toBe('provisioning');
    expect(device.tags).toContain('bmaas');
    expect(device.tags?.some((tag) => tag.startsWith(CREATE_TAG_PREFIX))).toBe(true);
    expect(devicesOn(reservation.id)).toHaveLength(1);
  });

  it('finds the device of a create whose answer was lost instead of creating another', async () => {
    const reservation = freeReservation();
    api.fail('POST /projects/{id}/devices', { drop: true });
    const posts = api.requestsTo('POST /projects/{id}/devices').length;

    const device = await fastClient(api).createDevice(api.projectId, request(reservation.id));

    expect(devicesOn(reservation.id).map((d) => d.id)).toEqual([device.id]);
    expect(api.requestsTo('POST /projects/{id}/devices').length - posts).toBe(1);
    const lookup = api.requestsTo('GET /projects/{id}/devices').at(-1);
    expect(lookup?.query.tag).toMatch(new RegExp(`^${CREATE_TAG_PREFIX}`));
  });

  it('finds the device of a create answered with a 502 after it was done', async () => {
    const reservation = freeReservation();
    api.fail('POST /projects/{id}/devices', { status: 502, afterProcessing: true });
    const device = await fastClient(api).createDevice(api.projectId, request(reservation.id));
    expect(devicesOn(reservation.id).map((d) => d.id)).toEqual([device.id]);
  });

  it('creates once when the lost attempt never reached the API', async () => {
    const reservation = freeReservation();
    api.fail('POST /projects/{id}/devices', { status: 500 });
    const posts = api.requestsTo('POST /projects/{id}/devices').length;
    const device = await fastClient(api).createDevice(api.projectId, request(reservation.id));
    expect(devicesOn(reservation.id).map((d) => d.id)).toEqual([device.id]);
    expect(api.requestsTo('POST /projects/{id}/devices').length - posts).toBe(2);
  });

  it('reports a reservation taken by someone else as ReservationTakenError, without retrying', async () => {
    const reservation = freeReservation();
    api.addDevice({ hostname: 'someone-elses', reservationId: reservation.id });
    const posts = api.requestsTo('POST /projects/{id}/devices').length;

    const error = await fastClient(api)
      .createDevice(api.projectId, request(reservation.id))
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(ReservationTakenError);
    expect(error).toMatchObject({ reservationId: reservation.id, status: 422 });
    expect((error as Error).message).toContain(reservation.id);
    expect(api.requestsTo('POST /projects/{id}/devices').length - posts).toBe(1);
  });

  it('does not retry a create refused for another reason', async () => {
    const reservation = freeReservation();
    const error = await fastClient(api)
      .createDevice(api.projectId, { ...request(reservation.id), plan: 'c3.small.x86' })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EquinixApiError);
    expect(error).not.toBeInstanceOf(ReservationTakenError);
    expect((error as EquinixApiError).status).toBe(422);
  });
});

describe('SSH keys and actions', () => {
  it('creates, lists and updates project SSH keys', async () => {
    const client = fastClient(api);
    const created = await client.createSshKey(api.projectId, { label: 'client-test', key: sshKeyLine() });
    expect((await client.listSshKeys(api.projectId)).map((k) => k.id)).toContain(created.id);
    const updated = await client.updateSshKey(created.id, { label: 'client-test', key: sshKeyLine('renamed') });
    expect(updated.key).toBe(sshKeyLine('renamed'));
  });

  it('does not add an SSH key twice when the answer was lost', async () => {
    api.fail('POST /projects/{id}/ssh-keys', { drop: true });
    const key = await fastClient(api).createSshKey(api.projectId, { label: 'lost-key', key: sshKeyLine() });
    expect(api.sshKeys.filter((k) => k.label === 'lost-key').map((k) => k.id)).toEqual([key.id]);
  });

  it('reboots a device, and reports a missing one as 404', async () => {
    const device = api.addDevice({ hostname: 'reboot-me' });
    await fastClient(api).rebootDevice(device.id);
    expect(api.reboots(device.id)).toBe(1);
    expect(api.requestsTo('POST /devices/{id}/actions').at(-1)?.body).toEqual({ type: 'reboot' });
    await expect(fastClient(api).rebootDevice('00000000-0000-0000-0000-000000000000')).rejects.toMatchObject({
      status: 404,
    });
  });
});
