/**
 * The fake Redfish BMC's boot source override, for OS installation work: a
 * PATCH of the ComputerSystem's `Boot` is kept, shown, and handed to the
 * system's power backend (the lab's drives a VM's next boot with it).
 */
import { afterAll, beforeAll, expect, test } from 'vitest';
import { type FakeBootSource, FakeRedfishServer, SimulatedPower } from '../src/testing/index.js';

let bmc: FakeRedfishServer;
const handed: FakeBootSource[] = [];

beforeAll(async () => {
  bmc = await FakeRedfishServer.start();
  const power = Object.assign(new SimulatedPower(), {
    setBootSource: async (target: FakeBootSource) => {
      handed.push(target);
    },
  });
  bmc.addSystem('node07', { power });
  bmc.addSystem('node08');
});
afterAll(() => bmc?.close());

async function patch(system: string, body: unknown, password = bmc.password): Promise<number> {
  const response = await fetch(bmc.systemUrl(system), {
    method: 'PATCH',
    headers: {
      authorization: `Basic ${Buffer.from(`${bmc.username}:${password}`).toString('base64')}`,
      'content-type': 'application/json',
    },
    body: JSON.stringify(body),
  });
  await response.body?.cancel();
  return response.status;
}

async function boot(system: string): Promise<unknown> {
  const response = await fetch(bmc.systemUrl(system), {
    headers: { authorization: `Basic ${Buffer.from(`${bmc.username}:${bmc.password}`).toString('base64')}` },
  });
  return ((await response.json()) as { Boot: unknown }).Boot;
}

test('a boot override is kept, shown and handed to the backend; disabling it hands None', async () => {
  expect(await boot('node07')).toMatchObject({
    BootSourceOverrideTarget: 'None',
    BootSourceOverrideEnabled: 'Disabled',
  });
  expect(await patch('node07', { Boot: { BootSourceOverrideTarget: 'Pxe', BootSourceOverrideEnabled: 'Once' } })).toBe(
    204,
  );
  expect(await boot('node07')).toMatchObject({ BootSourceOverrideTarget: 'Pxe', BootSourceOverrideEnabled: 'Once' });
  expect(bmc.bootOverride('node07')).toEqual({ target: 'Pxe', enabled: 'Once', mode: 'UEFI' });
  expect(await patch('node07', { Boot: { BootSourceOverrideEnabled: 'Disabled' } })).toBe(204);
  expect(handed).toEqual(['Pxe', 'None']);
  // Simulated power keeps no boot device: the fake records the override all the same.
  expect(await patch('node08', { Boot: { BootSourceOverrideTarget: 'Hdd' } })).toBe(204);
  expect(bmc.bootOverride('node08')).toEqual({ target: 'Hdd', enabled: 'Once', mode: 'UEFI' });
});

test('a bad override is refused and changes nothing; so is one without credentials', async () => {
  expect(await patch('node08', { Boot: { BootSourceOverrideTarget: 'Floppy' } })).toBe(400);
  expect(
    await patch('node08', { Boot: { BootSourceOverrideTarget: 'Pxe', BootSourceOverrideEnabled: 'Always' } }),
  ).toBe(400);
  expect(await patch('node08', { Boot: { BootSourceOverrideTarget: 'Pxe', BootSourceOverrideMode: 'BIOS' } })).toBe(
    400,
  );
  expect(await patch('node08', { Boot: { BootSourceOverrideTarget: 'Pxe' } }, 'wrong')).toBe(401);
  expect(bmc.bootOverride('node08')).toEqual({ target: 'Hdd', enabled: 'Once', mode: 'UEFI' });
});
