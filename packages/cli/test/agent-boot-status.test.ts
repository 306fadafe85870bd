/**
 * `shepherd status` through the built CLI: how many machines' agents arrive
 * over SSH, and how many are booted by their BMC, as text and JSON.
 */
import { addProvided, newMachine, setAgentBootMethods } from '@bmaas/bmdb-model';
import { beforeAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { buildOnce, shepherd } from './helpers.js';

const { db, bmdb } = await testBMDB();
const q = bmdb.db;

beforeAll(async () => {
  await buildOnce();
  const methods = new Map([
    ['rack1-node1', 'virtual-media'],
    ['rack1-node2', 'virtual-media'],
    ['rack1-node3', 'network'],
    ['rack1-node4', 'ssh'],
  ] as const);
  for (const id of methods.keys()) {
    await addProvided(q, await newMachine(q), { provider: 'Static', providerId: id });
  }
  await setAgentBootMethods(q, 'Static', methods);
});

test('status counts the machines per boot method', async () => {
  const env = { SHEPHERD_BMDB_URL: db.url, DEBUG: '' };
  const text = await shepherd(['status'], env);
  expect(text.code).toBe(0);
  expect(text.stdout).toMatch(/^Agent boot:\n {2}ssh +1\n {2}virtual-media +2\n {2}network +1\n/m);
  const json = JSON.parse((await shepherd(['status', '--json'], env)).stdout);
  expect(json.agentBoots).toEqual({ 'virtual-media': 2, network: 1 });
});
