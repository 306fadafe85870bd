/**
 * Retired machines through the built CLI: `decommission` retires what it
 * removes, `status` shows the retired machines (text and JSON), and
 * `recommission` brings them back, refusing with exit 2 any provider ID that
 * is not retired.
 */
import { addProvided, newMachine, retiredProviderIds } from '@bmaas/bmdb-model';
import { beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { buildOnce, shepherd } from './helpers.js';

const { db, bmdb } = await testBMDB();
const q = bmdb.db;
const env = () => ({ SHEPHERD_BMDB_URL: db.url, DEBUG: '' });
const machines: Record<string, string> = {};

beforeAll(async () => {
  await buildOnce();
  for (const id of ['rack2-node1', 'rack2-node2', 'rack2-node3']) {
    machines[id] = await newMachine(q);
    await addProvided(q, machines[id] as string, { provider: 'Static', providerId: id });
  }
});

test('decommission retires; status shows it; recommission brings it back, all or nothing', async () => {
  const decommissioned = await shepherd(
    [
      'decommission',
      '--provider',
      'Static',
      '--provider-id',
      'rack2-node1,rack2-node2',
      '--reason',
      'returned to the lessor',
      '--actor',
      'tech@rack2',
    ],
    env(),
  );
  expect(decommissioned.code, decommissioned.stderr).toBe(0);
  expect(decommissioned.stdout).toBe(
    `removed Static rack2-node1 (machine ${machines['rack2-node1']})\nremoved Static rack2-node2 (machine ${machines['rack2-node2']})\n`,
  );

  const text = await shepherd(['status'], env());
  expect(text.code).toBe(0);
  expect(text.stdout).toMatch(/^Retired: 2\n {2}PROVIDER +PROVIDER ID +WAS MACHINE +RETIRED +BY +WIPED +REASON\n/m);
  expect(text.stdout).toMatch(
    new RegExp(
      `^ {2}Static +rack2-node1 +${machines['rack2-node1']} +\\S+ +tech@rack2 +no +returned to the lessor$`,
      'm',
    ),
  );
  const json = JSON.parse((await shepherd(['status', '--json'], env())).stdout);
  expect(json.retired).toBe(2);
  expect(json.retiredMachines).toEqual(
    expect.arrayContaining([
      {
        provider: 'Static',
        providerId: 'rack2-node2',
        machineId: machines['rack2-node2'],
        retiredAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
        actor: 'tech@rack2',
        reason: 'returned to the lessor',
        wiped: false,
      },
    ]),
  );

  // A machine in service and an unknown one are bad input: named, exit 2, nothing recommissioned.
  const refused = await shepherd(
    ['recommission', '--provider', 'Static', '--provider-id', 'rack2-node1', 'rack2-node3', 'ghost'],
    env(),
  );
  expect(refused.code).toBe(2);
  expect(refused.stderr).toBe(
    `shepherd: --provider-id: not retired, so not recommissioned: Static ghost (not in the BMDB), Static rack2-node3 (machine ${machines['rack2-node3']}, in service); nothing was recommissioned\n`,
  );
  expect(await retiredProviderIds(q, 'Static')).toEqual(new Set(['rack2-node1', 'rack2-node2']));

  const recommissioned = await shepherd(
    ['recommission', '--provider', 'Static', '--provider-id', 'rack2-node1', '--reason', 'back from the lessor'],
    env(),
  );
  expect(recommissioned.code, recommissioned.stderr).toBe(0);
  expect(recommissioned.stdout).toMatch(
    new RegExp(
      `^recommissioned Static rack2-node1 \\(was machine ${machines['rack2-node1']}, retired \\S+\\): the provisioner brings it in as a new machine while its provider lists it\n$`,
    ),
  );
  expect(await retiredProviderIds(q, 'Static')).toEqual(new Set(['rack2-node2']));
  expect(JSON.parse((await shepherd(['status', '--json'], env())).stdout).retired).toBe(1);
});

test('recommission without --provider or --provider-id exits 2 naming the flag', async () => {
  const noProvider = await shepherd(['recommission', '--provider-id', 'rack2-node2'], env());
  expect(noProvider.code).toBe(2);
  expect(noProvider.stderr).toMatch(/^shepherd: --provider: required for recommission/);
  const noIds = await shepherd(['recommission', '--provider', 'Static'], env());
  expect(noIds.code).toBe(2);
  expect(noIds.stderr).toMatch(/^shepherd: --provider-id: required for recommission/);
  const extra = await shepherd(['recommission', 'rack2-node2', '--provider', 'Static'], env());
  expect(extra.code).toBe(2);
  expect(extra.stderr).toBe('shepherd: recommission: unexpected argument "rack2-node2"; see --help\n');
  expect(await retiredProviderIds(q, 'Static')).toEqual(new Set(['rack2-node2']));
  const help = await shepherd(['recommission', '--help']);
  expect(help.code).toBe(0);
  expect(help.stdout).toContain('Bring retired (decommissioned) machines back');
  for (const flag of ['--provider', '--provider-id', '--reason', '--actor', '--bmdb-url']) {
    expect(help.stdout).toContain(flag);
  }
});
