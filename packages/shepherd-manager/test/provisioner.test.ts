import { parseLimiter, type Session, SessionExpiredError } from '@bmaas/bmdb-controlloop';
import {
  addProvided,
  agentBootMethod,
  decommissionMachines,
  machinesForAgentBoot,
  machinesForAgentStart,
  newMachine,
  ProviderStatus,
  providedMachines,
  recommissionMachines,
  retiredMachines,
  updateProviderStatus,
} from '@bmaas/bmdb-model';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import {
  Availability,
  type CreateMachineRequest,
  type Machine,
  type Provider,
  ProviderDiscrepancyError,
  Provisioner,
} from '../src/index.js';
import { resolvePossiblyUsed } from '../src/provisioner.js';
import { TestProvider } from './test-provider.js';

const { db, bmdb } = await testBMDB();

const fastLimiters = () => ({
  reconcileLimiter: parseLimiter('1ms,1'),
  creationLimiter: parseLimiter('1ms,100'),
});

/** A clean BMDB for the provider's machines. */
async function forget(provider: Provider): Promise<void> {
  await db.admin(
    'DELETE FROM machines WHERE machine_id IN (SELECT machine_id FROM machine_provided WHERE provider = $1)',
    [provider.type],
  );
  await db.admin('DELETE FROM machine_retired WHERE provider = $1', [provider.type]);
}

/**
 * An inventory of named machines, as the static provider's: each listed as
 * possibly used, and taken into use under its own name.
 */
class Inventory implements Provider {
  readonly type = 'Inventory';
  readonly names = new Set<string>();

  async listMachines(): Promise<Machine[]> {
    return [...this.names].map((id) => this.#machine(id));
  }

  async getMachine(id: string): Promise<Machine> {
    return this.#machine(id);
  }

  async createMachine(session: Session, request: CreateMachineRequest): Promise<Machine> {
    const id = request.unusedMachine.id as string;
    await session.transact(async (q) => addProvided(q, await newMachine(q), { provider: this.type, providerId: id }));
    return this.#machine(id);
  }

  #machine(id: string): Machine {
    return {
      id,
      address: '192.0.2.7',
      availability: Availability.PossiblyUsed,
      failed: false,
      agentBoot: 'ssh',
      macs: [],
    };
  }
}

describe('Provisioner', () => {
  test('brings exactly max-count machines in, chunk by chunk, all known to the provider', async () => {
    const provider = new TestProvider(100);
    const provisioner = new Provisioner(provider, { maxCount: 10, chunkSize: 4, ...fastLimiters() });
    const stop = new AbortController();
    const running = provisioner.run(bmdb, { signal: stop.signal });
    const provided = async () => providedMachines(bmdb.db, provider.type);
    await eventually(async () => ((await provided()).length >= 10 ? true : undefined));
    // A few more passes: it must stop at the limit.
    const passes = provider.listings;
    await eventually(async () => (provider.listings >= passes + 3 ? true : undefined));
    stop.abort();
    await running;

    const machines = await provided();
    expect(machines).toHaveLength(10);
    for (const machine of machines) expect(provider.machines.has(machine.providerId)).toBe(true);
    expect(provider.createAttempts).toHaveLength(10);
    expect((await db.admin("SELECT count(*)::int AS n FROM sessions WHERE component_name = 'test'")).rows[0].n).toBe(0);
    await forget(provider);
  });

  test('creates at most chunk-size machines per pass, and nothing beyond the limit', async () => {
    const provider = new TestProvider(100);
    const provisioner = new Provisioner(provider, { maxCount: 10, chunkSize: 4, ...fastLimiters() });
    const session = await bmdb.startSession();
    const passes = [];
    for (let i = 0; i < 4; i++) passes.push(await provisioner.reconcile(session));
    expect(passes.map((p) => [p.managed, p.created.length])).toEqual([
      [0, 4],
      [4, 4],
      [8, 2],
      [10, 0],
    ]);
    await session.close();
    await forget(provider);
  });

  test('maxCount 0 means no limit; a failed creation does not stop the others', async () => {
    const provider = new TestProvider(6);
    provider.failCreation.add('machine-1');
    const provisioner = new Provisioner(provider, { maxCount: 0, chunkSize: 100, ...fastLimiters() });
    const session = await bmdb.startSession();
    const report = await provisioner.reconcile(session);
    expect(report.created).toEqual(['machine-0', 'machine-2', 'machine-3', 'machine-4', 'machine-5']);
    expect(report.failed.map((f) => (f.error as Error).message)).toEqual(['provider refused to create machine-1']);
    const next = await provisioner.reconcile(session);
    expect(next.created).toEqual(['machine-6']);
    expect(next.managed).toBe(5);
    await session.close();
    await forget(provider);
  });

  test('refuses to act on a provider/BMDB discrepancy, naming every offending ID; failed machines excepted', async () => {
    const provider = new TestProvider(20);
    const provisioner = new Provisioner(provider, { maxCount: 20, chunkSize: 2, ...fastLimiters() });
    const session = await bmdb.startSession();
    await provisioner.reconcile(session);
    expect(provider.machines.size).toBe(2);

    // Two machines in use at the provider unknown to the BMDB, one failed (excepted)...
    for (const [id, failed] of [
      ['rogue-a', false],
      ['rogue-b', false],
      ['broken', true],
    ] as const) {
      provider.machines.set(id, {
        id,
        address: '192.0.2.1',
        availability: Availability.KnownUsed,
        failed,
        agentBoot: 'ssh',
        macs: [],
      });
    }
    // ...and a BMDB machine the provider no longer lists.
    provider.machines.delete('machine-0');

    const attempt = provisioner.reconcile(session);
    await expect(attempt).rejects.toBeInstanceOf(ProviderDiscrepancyError);
    const error = (await attempt.catch((e: unknown) => e)) as ProviderDiscrepancyError;
    expect(error.missingFromBMDB).toEqual(['rogue-a', 'rogue-b']);
    expect(error.missingFromProvider).toEqual(['machine-0']);
    expect(error.message).toContain('rogue-a, rogue-b');
    expect(error.message).toContain('machine-0');
    expect(error.message).not.toContain('broken');
    // The operator is told the way out for machines gone at the provider.
    expect(error.message).toContain(
      `remove them from the BMDB with \`shepherd decommission --provider ${provider.type} --provider-id machine-0\``,
    );
    expect(provider.createAttempts).toHaveLength(2); // nothing created while it holds

    // A BMDB machine that failed for good may be gone at the provider.
    provider.machines.delete('rogue-a');
    provider.machines.delete('rogue-b');
    await session.transact((q) =>
      updateProviderStatus(q, provider.type, 'machine-0', {
        providerStatus: ProviderStatus.ProvisioningFailedPermanent,
      }),
    );
    const resumed = await provisioner.reconcile(session);
    expect(resumed.created).toHaveLength(2);
    await session.close();
    await forget(provider);
  });

  test('a failed machine the BMDB does not know is neither managed nor capacity', async () => {
    const provider = new TestProvider(0);
    provider.machines.set('failed-orphan', {
      id: 'failed-orphan',
      address: undefined,
      availability: Availability.PossiblyUsed,
      failed: true,
      agentBoot: 'ssh',
      macs: [],
    });
    const provisioner = new Provisioner(provider, { maxCount: 5, chunkSize: 5, ...fastLimiters() });
    const session = await bmdb.startSession();
    expect(await provisioner.reconcile(session)).toEqual({
      managed: 0,
      available: 0,
      created: [],
      failed: [],
      bootMethodsChanged: 0,
      retired: [],
      forgotten: [],
    });
    expect(provider.createAttempts).toEqual([]);
    await session.close();
  });

  test('stops a pass once its session expired, even when the provider wraps the session error', async () => {
    const session = await bmdb.startSession();
    // A provider that takes the machine first and reports a failed record in its own error, as
    // EquinixProvider does (DeviceNotRecordedError); the session expires in the middle of the first one.
    const provider = new (class extends TestProvider {
      override async createMachine(...args: Parameters<TestProvider['createMachine']>) {
        if (this.createAttempts.length === 0) {
          await db.admin("UPDATE sessions SET deadline = now() - interval '1 minute' WHERE session_id = $1", [
            session.id,
          ]);
        }
        try {
          return await super.createMachine(...args);
        } catch (error) {
          throw new Error('machine taken at the provider but not recorded', { cause: error });
        }
      }
    })(10);
    const provisioner = new Provisioner(provider, { maxCount: 5, chunkSize: 5, ...fastLimiters() });
    await expect(provisioner.reconcile(session)).rejects.toBeInstanceOf(SessionExpiredError);
    // Only the machine in flight when it expired; not one more per remaining slot of the chunk.
    expect(provider.createAttempts).toEqual(['machine-0']);
    await session.close();
    await forget(provider);
  });

  test('run() keeps going after a refusal and resumes once the discrepancy is gone', async () => {
    const provider = new TestProvider(10);
    provider.machines.set('stray', {
      id: 'stray',
      address: undefined,
      availability: Availability.KnownUsed,
      failed: false,
      agentBoot: 'ssh',
      macs: [],
    });
    const provisioner = new Provisioner(provider, { maxCount: 3, chunkSize: 3, ...fastLimiters() });
    const stop = new AbortController();
    const running = provisioner.run(bmdb, { signal: stop.signal });
    // Two passes saw the stray: neither created anything.
    await eventually(async () => (provider.listings >= 2 ? true : undefined));
    expect(provider.createAttempts).toEqual([]);
    provider.machines.delete('stray');
    await eventually(async () => (provider.createAttempts.length >= 3 ? true : undefined));
    stop.abort();
    await running;
    expect(provider.createAttempts).toHaveLength(3);
    await forget(provider);
  });

  test("the BMDB follows the provider's boot methods: new machines at once, a switched one in the next pass", async () => {
    const provider = new TestProvider(10);
    const provisioner = new Provisioner(provider, { maxCount: 3, chunkSize: 3, ...fastLimiters() });
    const session = await bmdb.startSession();
    provider.agentBoot = 'virtual-media';
    const first = await provisioner.reconcile(session);
    expect(first.created).toHaveLength(2 + 1);
    expect(first.bootMethodsChanged).toBe(3);
    const byProviderId = async () =>
      new Map((await providedMachines(bmdb.db, provider.type)).map((m) => [m.providerId, m.machineId]));
    const ids = await byProviderId();
    const machineOf = (providerId: string) => ids.get(providerId) ?? '';
    const booted = async () =>
      (await machinesForAgentBoot(bmdb.db, { provider: provider.type, limit: 10 })).map((m) => m.machineId).sort();
    const started = async () =>
      (await machinesForAgentStart(bmdb.db, { provider: provider.type, limit: 10 })).map((m) => m.machineId).sort();
    expect(await booted()).toEqual([...ids.values()].sort());
    expect(await started()).toEqual([]);

    // The inventory switches one machine to SSH and another to network boot.
    const [a, b] = ['machine-0', 'machine-1'];
    for (const [id, method] of [
      [a, 'ssh'],
      [b, 'network'],
    ] as const) {
      const machine = provider.machines.get(id);
      if (machine === undefined) throw new Error(`no ${id}`);
      machine.agentBoot = method;
    }
    const second = await provisioner.reconcile(session);
    expect(second.bootMethodsChanged).toBe(2);
    expect([await agentBootMethod(bmdb.db, machineOf(a)), await agentBootMethod(bmdb.db, machineOf(b))]).toEqual([
      'ssh',
      'network',
    ]);
    expect(await started()).toEqual([machineOf(a)]);
    expect(await booted()).not.toContain(machineOf(a));
    // Nothing changed: nothing written.
    expect((await provisioner.reconcile(session)).bootMethodsChanged).toBe(0);
    await session.close();
    await forget(provider);
  });

  test('a decommissioned machine its inventory lists stays retired until recommissioned, and is forgotten once unlisted', async () => {
    const inventory = new Inventory();
    inventory.names.add('inv-a').add('inv-b');
    const provisioner = new Provisioner(inventory, { maxCount: 0, ...fastLimiters() });
    const session = await bmdb.startSession();
    const machineIdOf = async (providerId: string) =>
      (await providedMachines(bmdb.db, inventory.type)).find((m) => m.providerId === providerId)?.machineId;
    try {
      expect((await provisioner.reconcile(session)).created).toEqual(['inv-a', 'inv-b']);
      const first = await machineIdOf('inv-a');
      await session.transact((q) =>
        decommissionMachines(q, inventory.type, ['inv-a'], { actor: 'alice@ops', reason: 'returned' }),
      );

      // Neither capacity nor a discrepancy: left out, pass after pass.
      for (let pass = 0; pass < 2; pass++) {
        expect(await provisioner.reconcile(session)).toMatchObject({
          managed: 1,
          available: 0,
          created: [],
          retired: ['inv-a'],
          forgotten: [],
        });
      }
      expect(await machineIdOf('inv-a')).toBeUndefined();
      expect(await retiredMachines(bmdb.db, { provider: inventory.type })).toMatchObject([
        { providerId: 'inv-a', machineId: first, actor: 'alice@ops', reason: 'returned', wiped: false },
      ]);

      // Brought back on purpose: a new machine.
      await session.transact((q) => recommissionMachines(q, inventory.type, ['inv-a']));
      expect(await provisioner.reconcile(session)).toMatchObject({ created: ['inv-a'], retired: [] });
      const second = await machineIdOf('inv-a');
      expect(second).toBeDefined();
      expect(second).not.toBe(first);

      // Retired again, then its entry leaves the inventory: forgotten, so an entry added again is new. Not in a
      // pass that refuses (an inventory that lost the machines in service too, served empty by mistake).
      await session.transact((q) => decommissionMachines(q, inventory.type, ['inv-a']));
      inventory.names.clear();
      await expect(provisioner.reconcile(session)).rejects.toBeInstanceOf(ProviderDiscrepancyError);
      expect(await retiredMachines(bmdb.db, { provider: inventory.type })).toMatchObject([{ providerId: 'inv-a' }]);
      inventory.names.add('inv-b');
      expect(await provisioner.reconcile(session)).toMatchObject({ created: [], retired: [], forgotten: ['inv-a'] });
      expect(await retiredMachines(bmdb.db, { provider: inventory.type })).toEqual([]);
      inventory.names.add('inv-a');
      expect(await provisioner.reconcile(session)).toMatchObject({ created: ['inv-a'] });
    } finally {
      await session.close();
      await forget(inventory);
    }
  });

  test('a retired machine the provider lists as in use is no discrepancy', async () => {
    const provider = new TestProvider(3);
    const provisioner = new Provisioner(provider, { maxCount: 3, chunkSize: 3, ...fastLimiters() });
    const session = await bmdb.startSession();
    try {
      expect((await provisioner.reconcile(session)).created).toHaveLength(3);
      await session.transact((q) => decommissionMachines(q, provider.type, ['machine-1']));
      expect(await provisioner.reconcile(session)).toMatchObject({ managed: 2, created: [], retired: ['machine-1'] });
      expect(provider.createAttempts).toHaveLength(3);
    } finally {
      await session.close();
      await forget(provider);
    }
  });

  test('rejects a negative max count or a zero chunk size', () => {
    const provider = new TestProvider(1);
    expect(() => new Provisioner(provider, { maxCount: -1 })).toThrow(/maxCount must be a whole number >= 0/);
    expect(() => new Provisioner(provider, { chunkSize: 0 })).toThrow(/chunkSize must be a whole number >= 1, got 0/);
  });
});

describe('resolvePossiblyUsed', () => {
  const inBMDB = new Set(['provided-machine']);
  const machine = (id: string | undefined, availability: Availability): Machine => ({
    id,
    availability,
    address: undefined,
    failed: false,
    agentBoot: 'ssh',
    macs: [],
  });

  test.each([
    ['skips KnownUsed', 'provided-machine', Availability.KnownUsed, Availability.KnownUsed],
    ['skips KnownUnused', 'provided-machine', Availability.KnownUnused, Availability.KnownUnused],
    ['no ID', undefined, Availability.PossiblyUsed, Availability.KnownUnused],
    ['empty ID', '', Availability.PossiblyUsed, Availability.KnownUnused],
    ['valid ID, not in the BMDB', 'unused-machine', Availability.PossiblyUsed, Availability.KnownUnused],
    ['valid ID, in the BMDB', 'provided-machine', Availability.PossiblyUsed, Availability.KnownUsed],
  ])('%s', (_, id, availability, expected) => {
    expect(resolvePossiblyUsed(machine(id, availability), inBMDB)).toBe(expected);
  });
});
