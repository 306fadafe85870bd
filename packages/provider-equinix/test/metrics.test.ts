import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { fastClient, startFake } from './helpers.js';

describe('API metrics', () => {
  it('exposes latency by templated endpoint and status, in-flight, waiting and retries', async () => {
    const api = await startFake();
    const registry = new Registry();
    const client = fastClient(api, { metrics: registry, maxConcurrency: 1 });
    const device = api.addDevice({ hostname: 'metered' });
    api.fail('GET /devices/{id}', { status: 503 });

    await Promise.all([client.getDevice(device.id), client.listDevices(api.projectId)]);
    await client.getDevice('00000000-0000-4000-8000-000000000000').catch(() => undefined);

    const text = await registry.metrics();
    expect(text).toContain(
      'equinix_api_request_duration_seconds_count{method="GET",endpoint="/devices/{id}",status="200"} 1',
    );
    expect(text).toContain(
      'equinix_api_request_duration_seconds_count{method="GET",endpoint="/devices/{id}",status="503"} 1',
    );
    expect(text).toContain(
      'equinix_api_request_duration_seconds_count{method="GET",endpoint="/devices/{id}",status="404"} 1',
    );
    expect(text).toContain('endpoint="/projects/{id}/devices",status="200"');
    expect(text).toContain('equinix_api_retries_total{method="GET",endpoint="/devices/{id}",reason="http_503"} 1');
    expect(text).toContain('equinix_api_requests_in_flight{method="GET",endpoint="/devices/{id}"} 0');
    expect(text).toContain('equinix_api_requests_waiting{method="GET",endpoint="/devices/{id}"} 0');
    // Raw IDs never become label values.
    expect(text).not.toContain(device.id);
    expect(text).not.toContain(api.projectId);
  });

  it('lets two clients share one registry', async () => {
    const api = await startFake();
    const registry = new Registry();
    const first = fastClient(api, { metrics: registry });
    const second = fastClient(api, { metrics: registry });
    await first.listSshKeys(api.projectId);
    await second.listSshKeys(api.projectId);
    expect(await registry.metrics()).toContain(
      'equinix_api_request_duration_seconds_count{method="GET",endpoint="/projects/{id}/ssh-keys",status="200"} 2',
    );
  });
});
