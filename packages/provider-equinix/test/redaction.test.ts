import { inspect } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { EquinixClient, EquinixProvider, Secret } from '../src/index.js';
import type { FakeEquinixApi } from '../src/testing/index.js';
import { fastClient, startFake } from './helpers.js';

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFc0gXoIKZ7PSJtVk0V1YeZ0m3c0p3dTk0lIFOgM3Ol5 shepherd@test';

const { lines: logs, restore } = captureDebugLog('shepherd:equinix*');
afterAll(restore);
let api: FakeEquinixApi;
beforeAll(async () => {
  api = await startFake({ reservations: 2, apiKey: 'tok-5ecret-d0-not-leak' });
});

describe('the API key', () => {
  it('is redacted in inspect, JSON and string forms of the client, its settings and the provider', () => {
    const client = new EquinixClient({ apiKey: api.apiKey, baseUrl: api.url });
    const provider = new EquinixProvider({
      client,
      projectId: api.projectId,
      devicePrefix: 'shep-',
      os: 'ubuntu_22_04',
      sshKeyLabel: 'shepherd',
      sshPublicKey: KEY,
    });
    const renderings = [
      inspect(client, { depth: 10, showHidden: true }),
      inspect(client.settings, { depth: 10 }),
      inspect(provider, { depth: 10, showHidden: true }),
      JSON.stringify(client.settings),
      JSON.stringify(provider),
      String(client.settings.apiKey),
      `${new Secret(api.apiKey)}`,
    ];
    for (const text of renderings) expect(text).not.toContain(api.apiKey);
    expect(inspect(client.settings)).toContain('Secret([redacted])');
  });

  it('stays out of error messages, even when the API echoes it', async () => {
    const client = fastClient(api);
    api.fail('GET /devices/{id}', { status: 400, body: { errors: [`token ${api.apiKey} is not allowed here`] } });
    const echoed = await client.getDevice('00000000-0000-4000-8000-000000000000').catch((e: unknown) => e);
    const wrongKey = await new EquinixClient({ apiKey: `${api.apiKey}-x`, baseUrl: api.url })
      .listDevices(api.projectId)
      .catch((e: unknown) => e);
    api.fail('GET /devices/{id}', { delay: 500 });
    const timedOut = await fastClient(api, { requestTimeout: 20, retry: { maxAttempts: 1 } })
      .getDevice('00000000-0000-4000-8000-000000000000')
      .catch((e: unknown) => e);

    for (const error of [echoed, wrongKey, timedOut]) {
      expect(error).toBeInstanceOf(Error);
      expect((error as Error).message).not.toContain(api.apiKey);
      expect(inspect(error, { depth: 10 })).not.toContain(api.apiKey);
    }
    expect((echoed as Error).message).toContain('token [redacted] is not allowed here');
  });

  it('never reaches the debug logs', async () => {
    const provider = new EquinixProvider({
      client: fastClient(api),
      projectId: api.projectId,
      devicePrefix: 'shep-',
      os: 'ubuntu_22_04',
      sshKeyLabel: 'shepherd',
      sshPublicKey: KEY,
    });
    api.fail('GET /projects/{id}/devices', { status: 500, times: 2 });
    api.fail('POST /projects/{id}/devices', { drop: true });
    await provider.listMachines();
    await provider.ensureSshKey();
    await fastClient(api).createDevice(api.projectId, {
      hostname: 'logged',
      plan: 'm3.large.x86',
      operating_system: 'ubuntu_22_04',
      hardware_reservation_id: api.reservations[0]?.id,
    });

    expect(logs.length).toBeGreaterThan(3);
    expect(logs.some((line) => line.includes('retrying'))).toBe(true);
    for (const line of logs) expect(line).not.toContain(api.apiKey);
  });
});
