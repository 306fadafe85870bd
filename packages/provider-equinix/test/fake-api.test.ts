// By package name, as other packages' tests import it: proves the ./testing export.
import type { FakeEquinixApi } from '@bmaas/provider-equinix/testing';
import { describe, expect, it } from 'vitest';
import { startFake } from './helpers.js';

async function call(api: FakeEquinixApi, method: string, path: string, body?: unknown, key = api.apiKey) {
  const response = await fetch(`${api.url}${path}`, {
    method,
    headers: { 'x-auth-token': key, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : undefined, headers: response.headers };
}

describe('FakeEquinixApi', () => {
  it('checks the API key and records calls without it', async () => {
    const api = await startFake();
    expect((await call(api, 'GET', `/projects/${api.projectId}/devices`, undefined, 'nope')).status).toBe(401);
    expect(api.requests.at(-1)).toMatchObject({ authenticated: false, route: 'GET /projects/{id}/devices' });
    expect(JSON.stringify(api.requests)).not.toContain(api.apiKey);
  });

  it('pages lists with meta like the real API', async () => {
    const api = await startFake({ reservations: 5 });
    const { body } = await call(api, 'GET', `/projects/${api.projectId}/hardware-reservations?page=2&per_page=2`);
    expect(body.hardware_reservations).toHaveLength(2);
    expect(body.meta).toMatchObject({ current_page: 2, last_page: 3, total: 5 });
    expect(body.meta.next.href).toBe(`/metal/v1/projects/${api.projectId}/hardware-reservations?page=3&per_page=2`);
  });

  it('creates a device from a reservation that turns active after its provisioning reads', async () => {
    const api = await startFake({ reservations: 1, provisioningReads: 2 });
    const reservation = api.reservations[0];
    const created = await call(api, 'POST', `/projects/${api.projectId}/devices`, {
      hostname: 'new',
      plan: 'm3.large.x86',
      operating_system: 'ubuntu_22_04',
      hardware_reservation_id: reservation?.id,
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ state: 'provisioning', ip_addresses: [] });
    expect(api.reservations[0]).toMatchObject({ provisionable: false, device: { href: expect.any(String) } });
    const states = [];
    for (let i = 0; i < 3; i++) states.push((await call(api, 'GET', `/devices/${created.body.id}`)).body.state);
    expect(states).toEqual(['provisioning', 'provisioning', 'active']);
    expect(api.device(created.body.id)?.ip_addresses).toHaveLength(3);
  });

  it('injects status codes with Retry-After, in order, for the given number of calls', async () => {
    const api = await startFake();
    api.fail('GET /projects/{id}/ssh-keys', { status: 429, retryAfter: 7, times: 2 });
    api.fail('GET /projects/{id}/ssh-keys', { status: 500, body: { error: 'boom' } });
    const path = `/projects/${api.projectId}/ssh-keys`;
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await call(api, 'GET', path));
    expect(answers.map((a) => a.status)).toEqual([429, 429, 500, 200]);
    expect(answers[0]?.headers.get('retry-after')).toBe('7');
    expect(answers[2]?.body).toEqual({ error: 'boom' });
  });

  it('drops the answer after doing the work', async () => {
    const api = await startFake();
    api.fail('POST /projects/{id}/ssh-keys', { drop: true });
    await expect(
      call(api, 'POST', `/projects/${api.projectId}/ssh-keys`, { label: 'k', key: 'ssh-ed25519 AAAA k' }),
    ).rejects.toThrow();
    expect(api.sshKeys.map((k) => k.label)).toEqual(['k']);
  });
});
