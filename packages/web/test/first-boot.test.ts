/**
 * Whether an installed OS came up, on the machine's page and in its JSON:
 * booted (when, with its host keys), booting, or installed-not-booted past
 * the bound (time moved in the database); and what its config drive gives
 * it (hostname, SSH keys, network).
 */
import { randomBytes } from 'node:crypto';
import {
  AgentHeartbeats,
  addProvided,
  bootSecretSha256,
  newMachine,
  recordFirstBoot,
  requestOSInstallation,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
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

/** A machine installed as its agent reports it, with the first-boot secret's hash; returns it and the secret. */
async function installedMachine(providerId: string): Promise<{ machineId: string; secret: string }> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Static', providerId });
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, { publicKey: key });
  await requestOSInstallation(q, machineId, {
    imageUrl: 'https://images.example.com/debian-12.img',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/sda',
    sshPublicKeys: [KEY],
    actor: 'alice@ops',
    reason: 'page test',
  });
  await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
  const secret = randomBytes(32).toString('base64url');
  await AgentHeartbeats.of(bmdb).answer({
    machineId,
    publicKey: key,
    installationReport: {
      generation: 1n,
      result: 'Success',
      raw: new Uint8Array([8, 1]),
      bootSecretSha256: bootSecretSha256(secret),
    },
  });
  return { machineId, secret };
}

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
    const booted = await installedMachine('web-node1');
    const silent = await installedMachine('web-node2');
    const fresh = await installedMachine('web-node3');
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
