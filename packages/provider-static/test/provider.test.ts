/**
 * The static provider with the real provisioner on a real BMDB: machines
 * from an inventory file, addresses kept current, removed machines refused
 * until decommissioned, and resets through the fake BMC with credentials from
 * the inventory, password files or fleet-wide defaults.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseLimiter } from '@bmaas/bmdb-controlloop';
import { agentBootMethod, decommissionMachines, providedMachines } from '@bmaas/bmdb-model';
import { MachineNotFoundError, ProviderDiscrepancyError, Provisioner } from '@bmaas/shepherd-manager';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { runUntil } from '../../../test/support/wait.js';
import {
  BmcCredentialsError,
  InventoryError,
  NoBmcError,
  RedfishClient,
  STATIC_PROVIDER,
  StaticProvider,
  type StaticProviderOptions,
} from '../src/index.js';
import { FakeRedfishServer } from '../src/testing/index.js';

let dir: string;
let bmc: FakeRedfishServer;
const redfish = new RedfishClient({ timeout: 2_000, retryDelay: 1 });

const { db, bmdb } = await testBMDB();

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'static-provider-'));
  bmc = await FakeRedfishServer.start();
});
afterAll(async () => {
  await redfish.close();
  await bmc.close();
  await rm(dir, { recursive: true, force: true });
});

async function writeInventory(name: string, machines: unknown, mode = 0o600): Promise<string> {
  const file = path.join(dir, name);
  await writeFile(file, JSON.stringify(machines, null, 2));
  await chmod(file, mode);
  return file;
}

function provider(inventory: string, options: Partial<StaticProviderOptions> = {}): StaticProvider {
  return new StaticProvider({ inventory, redfish, ...options });
}

const provisionerFor = (p: StaticProvider, maxCount = 0) =>
  new Provisioner(p, {
    maxCount,
    chunkSize: 2,
    reconcileLimiter: parseLimiter('1ms,1'),
    creationLimiter: parseLimiter('1ms,100'),
  });

const recorded = () => providedMachines(bmdb.db, STATIC_PROVIDER);

describe('provisioning from the inventory', () => {
  test('every inventory machine is recorded with address and location, in chunks, up to the limit', async () => {
    const file = await writeInventory('fleet.json', [
      { id: 'n1', address: '10.0.0.1', location: 'ams1' },
      { id: 'n2', address: '10.0.0.2', location: 'ams1' },
      { ID: 'n3', Addr: '2001:db8::3', Location: 'fra1' },
    ]);
    const p = provider(file);
    const session = await bmdb.startSession();
    try {
      const limited = provisionerFor(p, 2);
      expect(await limited.reconcile(session)).toMatchObject({ managed: 0, available: 3, created: ['n1', 'n2'] });
      expect(await limited.reconcile(session)).toMatchObject({ managed: 2, created: [] });
      const all = provisionerFor(p);
      expect(await all.reconcile(session)).toMatchObject({ managed: 2, available: 1, created: ['n3'] });
      expect(await all.reconcile(session)).toMatchObject({ managed: 3, available: 0, created: [] });
    } finally {
      await session.close();
    }
    expect(
      (await recorded()).map((m) => [m.providerId, m.providerIpAddress, m.providerLocation, m.providerStatus]),
    ).toEqual([
      ['n1', '10.0.0.1', 'ams1', 'Unknown'],
      ['n2', '10.0.0.2', 'ams1', 'Unknown'],
      ['n3', '2001:db8::3', 'fra1', 'Unknown'],
    ]);
  });

  test('a changed address or location reaches the BMDB after the next read', async () => {
    const file = await writeInventory('fleet.json', [
      { id: 'n1', address: '10.0.0.1', location: 'ams1' },
      { id: 'n2', address: '10.0.9.2', location: 'ams1' },
      { id: 'n3', address: '2001:db8::3' },
    ]);
    const p = provider(file);
    await runUntil(
      async (signal) => {
        const syncing = p.run(bmdb, { signal });
        await p.listMachines(signal);
        await syncing;
      },
      async () => (await recorded()).find((m) => m.providerId === 'n3')?.providerLocation === null,
      { what: 'syncing addresses' },
    );
    expect((await recorded()).map((m) => [m.providerId, m.providerIpAddress, m.providerLocation])).toEqual([
      ['n1', '10.0.0.1', 'ams1'],
      ['n2', '10.0.9.2', 'ams1'],
      ['n3', '2001:db8::3', null],
    ]);
    const { rows } = await db.admin('SELECT count(*)::int AS n FROM sessions');
    expect(rows[0].n).toBe(0); // its session closed at the stop
  });

  test('a machine whose BMC boots its agent is recorded without an address; a recorded address is kept', async () => {
    const ipmi = { protocol: 'ipmi', host: '10.1.0.9' };
    const file = await writeInventory('fleet.json', [
      { id: 'n1', address: '10.0.0.1', location: 'ams1' },
      { id: 'n2', address: '10.0.9.2', location: 'ams1' },
      // n3 had an address; now its BMC boots its agent and the inventory gives none.
      { id: 'n3', agentBoot: 'network', bmc: ipmi, macs: ['52:54:00:00:00:03'], location: 'fra1' },
      { id: 'n4', agentBoot: 'network', bmc: ipmi, macs: ['52:54:00:00:00:04'] },
    ]);
    const p = provider(file);
    expect((await p.listMachines()).slice(2)).toEqual([
      {
        id: 'n3',
        address: undefined,
        location: 'fra1',
        availability: 'PossiblyUsed',
        failed: false,
        agentBoot: 'network',
        macs: ['52:54:00:00:00:03'],
      },
      expect.objectContaining({ id: 'n4', agentBoot: 'network', macs: ['52:54:00:00:00:04'] }),
    ]);
    const session = await bmdb.startSession();
    try {
      expect(await provisionerFor(p).reconcile(session)).toMatchObject({ created: ['n4'] });
      expect(await p.syncAddresses(session)).toEqual(['n3']);
    } finally {
      await session.close();
    }
    expect((await recorded()).map((m) => [m.providerId, m.providerIpAddress, m.providerLocation])).toEqual([
      ['n1', '10.0.0.1', 'ams1'],
      ['n2', '10.0.9.2', 'ams1'],
      ['n3', '2001:db8::3', 'fra1'],
      ['n4', null, null],
    ]);
    await db.admin(
      `DELETE FROM machines WHERE machine_id IN (SELECT machine_id FROM machine_provided WHERE provider_id = 'n4')`,
    );
  });

  test('a machine created records its boot method with it, so the SSH initializer never sees a BMC-booted one', async () => {
    const file = await writeInventory('boot.json', [
      { id: 'vm-blank', agentBoot: 'virtual-media', bmc: { url: 'https://10.1.0.7/redfish/v1/Systems/1' } },
    ]);
    const p = provider(file);
    const [unused] = await p.listMachines();
    if (unused === undefined) throw new Error('no machine listed');
    const session = await bmdb.startSession();
    try {
      await p.createMachine(session, { unusedMachine: { ...unused, availability: 'KnownUnused' } });
    } finally {
      await session.close();
    }
    const [created] = (await recorded()).filter((m) => m.providerId === 'vm-blank');
    if (created === undefined) throw new Error('vm-blank not recorded');
    expect(await agentBootMethod(bmdb.db, created.machineId)).toBe('virtual-media');
    await db.admin('DELETE FROM machines WHERE machine_id = $1', [created.machineId]);
  });

  test('a bad inventory fails the pass and changes nothing; a machine removed is refused, naming the way out', async () => {
    const session = await bmdb.startSession();
    try {
      const before = await recorded();
      const bad = await writeInventory('bad.json', [
        { id: 'n1', address: '10.0.0.1' },
        { id: 'n1', address: '10.0.0.2' },
      ]);
      await expect(provisionerFor(provider(bad)).reconcile(session)).rejects.toThrow(InventoryError);
      expect(await recorded()).toEqual(before);

      const shrunk = await writeInventory('shrunk.json', [
        { id: 'n1', address: '10.0.0.1', location: 'ams1' },
        { id: 'n2', address: '10.0.9.2', location: 'ams1' },
      ]);
      const error = await provisionerFor(provider(shrunk))
        .reconcile(session)
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ProviderDiscrepancyError);
      expect(String(error)).toContain('in the BMDB but not listed by the provider: n3');
      expect(String(error)).toContain('shepherd decommission --provider Static --provider-id n3');
      expect(await recorded()).toEqual(before);

      // Decommissioned, the rest goes on.
      await session.transact((q) => decommissionMachines(q, STATIC_PROVIDER, ['n3']));
      expect(await provisionerFor(provider(shrunk)).reconcile(session)).toMatchObject({ managed: 2, created: [] });
    } finally {
      await session.close();
    }
  });
});

describe('power-cycling through the BMC', () => {
  test('credentials from the inventory, a password file or the fleet-wide defaults; the override reset type', async () => {
    const passwordFile = path.join(dir, 'bmc-password');
    await writeFile(passwordFile, `${bmc.password}\n`, { mode: 0o600 });
    const file = await writeInventory('bmc.json', [
      {
        id: 'inline',
        address: '10.0.1.1',
        bmc: { url: bmc.addSystem('inline'), username: 'admin', password: bmc.password },
      },
      { id: 'file', address: '10.0.1.2', bmc: { url: bmc.addSystem('file'), username: 'admin', passwordFile } },
      { id: 'defaults', address: '10.0.1.3', bmc: { url: bmc.addSystem('defaults') } },
    ]);
    const p = provider(file, { defaultCredentials: { username: 'admin', passwordFile } });
    for (const id of ['inline', 'file', 'defaults']) await p.powerCycle(id);
    expect(bmc.resets.map((r) => [r.system, r.resetType])).toEqual([
      ['inline', 'ForceRestart'],
      ['file', 'ForceRestart'],
      ['defaults', 'ForceRestart'],
    ]);
    const cycling = provider(file, {
      defaultCredentials: { username: 'admin', passwordFile },
      resetType: 'PowerCycle',
    });
    expect(await cycling.powerCycle('defaults')).toEqual({ command: 'PowerCycle' });
  });

  test('each way a power cycle fails names the machine and the cause', async () => {
    const openFile = path.join(dir, 'open-password');
    await writeFile(openFile, 'secret\n', { mode: 0o644 });
    await chmod(openFile, 0o644);
    const file = await writeInventory('failing.json', [
      { id: 'no-bmc', address: '10.0.2.1' },
      { id: 'no-user', address: '10.0.2.2', bmc: { url: bmc.addSystem('no-user'), password: 'x' } },
      { id: 'no-password', address: '10.0.2.3', bmc: { url: bmc.addSystem('no-password'), username: 'admin' } },
      {
        id: 'open-file',
        address: '10.0.2.4',
        bmc: { url: bmc.addSystem('open-file'), username: 'admin', passwordFile: openFile },
      },
      {
        id: 'wrong',
        address: '10.0.2.5',
        bmc: { url: bmc.addSystem('wrong'), username: 'admin', password: 'wrong-pw' },
      },
    ]);
    const p = provider(file);
    const failure = (id: string): Promise<Error> =>
      p.powerCycle(id).then(
        () => new Error(`power-cycling ${id} succeeded`),
        (e: unknown) => e as Error,
      );
    expect(await failure('no-bmc')).toBeInstanceOf(NoBmcError);
    expect((await failure('no-bmc')).message).toBe(
      'machine no-bmc has no bmc in the inventory: its power cannot be read or controlled; add its Redfish URL',
    );
    expect(await failure('no-user')).toBeInstanceOf(BmcCredentialsError);
    expect((await failure('no-user')).message).toContain('machine no-user: no BMC user name');
    expect((await failure('no-password')).message).toContain('machine no-password: no BMC password');
    expect((await failure('open-file')).message).toBe(
      `machine open-file: BMC password file ${openFile} is readable by group or others (mode 0644); chmod 600 it`,
    );
    const refused = await failure('wrong');
    expect(refused).toBeInstanceOf(BmcCredentialsError);
    expect(refused).toMatchObject({ protocol: 'redfish' });
    expect(refused.message).toContain('machine wrong: BMC');
    expect(refused.message).toContain('BMC refused the credentials of user "admin" (HTTP 401)');
    expect(refused.message).not.toContain('wrong-pw');
    expect(await failure('not-in-inventory')).toBeInstanceOf(MachineNotFoundError);
    expect(bmc.resets.filter((r) => r.system !== 'inline' && r.system !== 'file' && r.system !== 'defaults')).toEqual(
      [],
    );
  });

  test('power cycles go by the last good inventory while a bad edit is in place', async () => {
    const file = await writeInventory('edited.json', [
      {
        id: 'kept',
        address: '10.0.3.1',
        bmc: { url: bmc.addSystem('kept'), username: 'admin', password: bmc.password },
      },
    ]);
    const p = provider(file);
    await p.listMachines();
    await writeFile(file, '[{"id": "kept", "address": ');
    await expect(p.listMachines()).rejects.toThrow(InventoryError);
    await p.powerCycle('kept');
    expect(bmc.resetsOf('kept')).toHaveLength(1);
  });
});
