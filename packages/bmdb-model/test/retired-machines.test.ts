import { randomBytes } from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import {
  AgentHeartbeats,
  addProvided,
  decommissionMachines,
  decommissionWithWipe,
  forgetUnlistedRetiredMachines,
  NotRetiredError,
  newMachine,
  recommissionMachines,
  retiredMachine,
  retiredMachineCount,
  retiredMachines,
  retiredProviderIds,
  setAgentStarted,
} from '../src/index.js';

const { bmdb } = await testBMDB();
const q = bmdb.db;

async function provided(provider: string, providerId: string): Promise<string> {
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider, providerId });
  return machineId;
}

describe('retirement', () => {
  test('a decommissioned machine is retired with its machine ID, actor and reason; decommissioned again, as last', async () => {
    const first = await provided('Retire', 'r1');
    await provided('Retire', 'r2');
    const report = await decommissionMachines(q, 'Retire', ['r1'], { actor: 'alice@ops', reason: 'returned' });
    expect(report.removed).toEqual([{ providerId: 'r1', machineId: first }]);
    expect(await retiredMachines(q, { provider: 'Retire' })).toMatchObject([
      { provider: 'Retire', providerId: 'r1', machineId: first, actor: 'alice@ops', reason: 'returned', wiped: false },
    ]);
    expect(await retiredProviderIds(q, 'Retire')).toEqual(new Set(['r1']));
    expect(await retiredMachine(q, first)).toMatchObject({ providerId: 'r1', machineId: first });
    expect(await retiredMachine(q, 'not-a-machine-id')).toBeUndefined();

    // Brought back by hand under the same ID and decommissioned again, without saying who: remembered as last.
    const second = await provided('Retire', 'r1');
    await decommissionMachines(q, 'Retire', ['r1']);
    expect(await retiredMachines(q, { provider: 'Retire' })).toMatchObject([
      { providerId: 'r1', machineId: second, actor: null, reason: null, wiped: false },
    ]);
    expect(await retiredMachineCount(q)).toBeGreaterThanOrEqual(1);
  });

  test('a machine wiped before its decommission is retired as wiped', async () => {
    const machineId = await provided('RetireWiped', 'w1');
    const key = new Uint8Array(randomBytes(32));
    await setAgentStarted(q, machineId, { publicKey: key });
    const wipe = { actor: 'bob@ops', reason: 'end of lease', retryFailed: false };
    const requested = (await decommissionWithWipe(q, 'RetireWiped', ['w1'], wipe)).wiping;
    expect(requested).toHaveLength(1);
    const generation = requested[0]?.generation ?? 0n;
    await AgentHeartbeats.of(bmdb).answer({ machineId, publicKey: key });
    await AgentHeartbeats.of(bmdb).answer({
      machineId,
      publicKey: key,
      installationReport: { generation, result: 'Success', raw: new Uint8Array([8, Number(generation)]) },
    });
    expect((await decommissionWithWipe(q, 'RetireWiped', ['w1'], wipe)).removed).toEqual([
      { providerId: 'w1', machineId },
    ]);
    expect(await retiredMachines(q, { provider: 'RetireWiped' })).toMatchObject([
      { providerId: 'w1', machineId, actor: 'bob@ops', reason: 'end of lease', wiped: true },
    ]);
  });

  test('recommissioning forgets retirements; an ID not retired refuses them all, naming it, and changes nothing', async () => {
    const inService = await provided('Recommission', 'live');
    await provided('Recommission', 'a');
    await provided('Recommission', 'b');
    await decommissionMachines(q, 'Recommission', ['a', 'b'], { actor: 'alice@ops' });

    const refused = await recommissionMachines(q, 'Recommission', ['a', 'live', 'ghost']).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(NotRetiredError);
    expect((refused as NotRetiredError).notRetired).toEqual([
      { providerId: 'ghost', machineId: undefined },
      { providerId: 'live', machineId: inService },
    ]);
    expect((refused as Error).message).toBe(
      `not retired, so not recommissioned: Recommission ghost (not in the BMDB), Recommission live (machine ${inService}, in service); nothing was recommissioned`,
    );
    expect(await retiredProviderIds(q, 'Recommission')).toEqual(new Set(['a', 'b']));

    const recommissioned = await recommissionMachines(q, 'Recommission', ['b', 'a', 'b']);
    expect(recommissioned.map((m) => [m.providerId, m.actor])).toEqual([
      ['a', 'alice@ops'],
      ['b', 'alice@ops'],
    ]);
    expect(await retiredProviderIds(q, 'Recommission')).toEqual(new Set());
    expect(await recommissionMachines(q, 'Recommission', [])).toEqual([]);
  });

  test('forgetting unlisted retirements leaves the listed ones and other providers alone', async () => {
    for (const id of ['x', 'y', 'z']) await provided('Forget', id);
    await provided('ForgetOther', 'x');
    await decommissionMachines(q, 'Forget', ['x', 'y', 'z']);
    await decommissionMachines(q, 'ForgetOther', ['x']);
    expect(await forgetUnlistedRetiredMachines(q, 'Forget', ['y', 'new'])).toEqual(['x', 'z']);
    expect(await retiredProviderIds(q, 'Forget')).toEqual(new Set(['y']));
    expect(await retiredProviderIds(q, 'ForgetOther')).toEqual(new Set(['x']));
    expect(await forgetUnlistedRetiredMachines(q, 'Forget', [])).toEqual(['y']);
  });
});
