import { recordFirstBoot } from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { installedMachine } from '../../../test/support/machines.js';
import { type FleetPageServer, serveFleetPage } from '../src/index.js';

const { bmdb } = await testBMDB();
const q = bmdb.db;
let server: FleetPageServer;
const HOST_KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH0st0Kq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5QeA root@db1';
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOp1bV7Yq2W8hA0Xw3u5mJc9tXJ0cJmXG1wYb4lDk5Qe alice@ops';

beforeAll(async () => {
  server = await serveFleetPage({ db: q, host: '127.0.0.1', port: 0 });
});
afterAll(async () => {
  await server?.close();
});

/** A machine installed as its agent reports it, asked with the operator's key; returns it and its first-boot secret. */
const installed = (providerId: string) =>
  installedMachine(bmdb, providerId, { sshPublicKeys: [KEY], actor: 'alice@ops', reason: 'page test' });

/** A machine's JSON, as far as these tests read it. */
interface MachineJson {
  readonly osInstallation: Record<string, unknown> & { readonly bootedAt: string | null };
}

const get = async (path: string) => {
  const response = await fetch(new URL(path, server.url));
  expect(response.status, path).toBe(200);
  return response;
};

describe('the first boot on the machine page', () => {
  test('booted with its time and host keys; booting; installed-not-booted past the bound: as HTML and JSON', async () => {
    const booted = await installed('web-node1');
    const silent = await installed('web-node2');
    const fresh = await installed('web-node3');
    await recordFirstBoot(q, booted.machineId, { secret: booted.secret, hostKeys: [HOST_KEY] });
    await sql`UPDATE machine_os_installation_request SET installation_ended_at = now() - interval '31 minutes'
      WHERE machine_id = ${silent.machineId}`.execute(q);

    const bootedPage = await (await get(`/machines/${booted.machineId}`)).text();
    expect(bootedPage).toContain('first boot as web-node1, 1 SSH key, DHCP on each NIC');
    expect(bootedPage).toMatch(/<span class="first-boot first-boot-booted">booted<\/span> <time[^>]*>/);
    expect(bootedPage).toContain(`host key ${HOST_KEY}`);
    expect(await (await get(`/machines/${silent.machineId}`)).text()).toContain(
      '<span class="first-boot first-boot-installed-not-booted">installed-not-booted</span> its OS has not reported its first boot',
    );
    expect(await (await get(`/machines/${fresh.machineId}`)).text()).toContain(
      '<span class="first-boot first-boot-booting">booting</span>',
    );

    const api = (await (await get(`/api/machines/${booted.machineId}`)).json()) as MachineJson;
    expect(api.osInstallation).toMatchObject({
      state: 'Succeeded',
      hostname: 'web-node1',
      sshPublicKeys: [KEY],
      firstBoot: 'booted',
      bootedHostKeys: [HOST_KEY],
    });
    expect(new Date(api.osInstallation.bootedAt ?? 0).getTime()).toBeGreaterThan(0);
    expect(api.osInstallation).not.toHaveProperty('bootSecretSha256');
    const silentApi = (await (await get(`/api/machines/${silent.machineId}`)).json()) as MachineJson;
    expect(silentApi.osInstallation).toMatchObject({ firstBoot: 'installed-not-booted', bootedAt: null });
  });
});
