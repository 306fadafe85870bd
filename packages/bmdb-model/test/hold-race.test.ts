/**
 * Holds placed while claims are being taken: sessions claim from selections
 * (batched, and a lone worker's claim) and through a retriever that leaves
 * held machines out, as fast as they can, finishing each
 * claim at once, while holds are placed on the same machines through
 * `holdMachine`, in `Session.transact` and in a transaction of its
 * own. The work history must show no claim that started after a hold on its
 * machine, and every claim running at a hold named by it. And what a hold
 * names beside claims: an OS installation under way.
 */
import { randomBytes } from 'node:crypto';
import type { Database } from '@bmaas/bmdb-controlloop';
import {
  BMDBError,
  hasLiveWork,
  isHeld,
  NothingToDoError,
  type Session,
  selectionFor,
  WorkConflictError,
} from '@bmaas/bmdb-controlloop';
import type { Kysely } from 'kysely';
import { sql } from 'kysely';
import { afterAll, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { holdsMeetingClaims, holdViolations, type ToldHold } from '../../../test/support/holds.js';
import { provideMachines } from '../../../test/support/machines.js';
import { AgentHeartbeats, holdMachine, Process, requestOSInstallation, setAgentStarted } from '../src/index.js';

const PROCESS = 'HoldRace';
const MACHINES = 24;

const { db, bmdb } = await testBMDB();
const sessions: Session[] = [];
afterAll(() => Promise.all(sessions.map((s) => s.close())));

/** The race's machines as a selection; in the other order, its claims batch apart (a lone worker's). */
const race = (order: 'asc' | 'desc') =>
  selectionFor(PROCESS, {
    query: bmdb.db
      .selectFrom('machine_provided')
      .select('machine_id')
      .where('provider', '=', 'HoldRace')
      .orderBy('machine_id', order),
    toCandidate: (row) => row.machine_id,
  });

/** A retriever's candidates: the race's machines free of the process's work and not held, in random order. */
const retrieveFree = (q: Kysely<Database>) =>
  q
    .selectFrom('machine_provided as mp')
    .select('mp.machine_id')
    .where('mp.provider', '=', 'HoldRace')
    .where(sql<boolean>`NOT ${hasLiveWork('mp.machine_id', [PROCESS])} AND NOT ${isHeld('mp.machine_id')}`)
    .orderBy(sql`random()`)
    .limit(1)
    .execute()
    .then((rows) => rows.map((row) => row.machine_id));

test('no claim committed after a hold is on its machine, and each one before it is named, under contention', async () => {
  const start = async () => {
    const s = await bmdb.startSession({ processor: 'hold-race' });
    sessions.push(s);
    return s;
  };
  const machines = await provideMachines(await start(), MACHINES, 'HoldRace');
  const claimers = await Promise.all(Array.from({ length: 7 }, start));
  const holder = await start();
  let holding = true;
  let claims = 0;
  const claiming = claimers.map(async (s, i) => {
    const selection = race(i === 0 ? 'desc' : 'asc');
    while (holding) {
      try {
        // One claims through a retriever that leaves held machines out, in its SERIALIZABLE transaction.
        const work = i === 1 ? await s.work(PROCESS, retrieveFree) : await s.work(PROCESS, selection);
        claims++;
        await work.finish();
      } catch (error) {
        if (!(error instanceof NothingToDoError || error instanceof WorkConflictError)) throw error;
      }
    }
  });

  // Two operators at once, one through a session's transaction, one in a transaction of the hold's own.
  const told: ToldHold[] = [];
  const holdEach = async (ids: readonly string[], through: 'session' | 'queries') => {
    for (const machineId of ids) {
      const request = { reason: 'hold race', actor: `${through}@race` };
      const result =
        through === 'session'
          ? await holder.transact((q) => holdMachine(q, machineId, request))
          : await holdMachine(bmdb.db, machineId, request);
      expect(result.placed).toBe(true);
      told.push({ machineId, liveWork: result.liveWork });
    }
  };
  try {
    await Promise.all([
      holdEach(machines.slice(0, MACHINES / 2), 'session'),
      holdEach(machines.slice(MACHINES / 2), 'queries'),
    ]);
  } finally {
    holding = false;
    await Promise.all(claiming);
  }

  expect(await holdViolations(db, PROCESS, told)).toEqual([]);
  expect(claims).toBeGreaterThan(MACHINES);
  // The holds met claims running, so the naming was put to the test.
  expect(holdsMeetingClaims(PROCESS, told)).toBeGreaterThan(0);
});

test('a hold names the work running and an installation under way (Delivered), not one only requested', async () => {
  const q = bmdb.db;
  const session = await bmdb.startSession({ processor: 'hold-naming' });
  sessions.push(session);
  const [installing, requested] = (await provideMachines(session, 2, 'HoldNaming')) as [string, string];
  const key = new Uint8Array(randomBytes(32));
  const image = {
    imageUrl: 'https://images.example.com/debian.img.gz',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/sda',
    compression: 'gzip',
    actor: 'alice@ops',
    reason: 'first install',
  } as const;
  for (const machineId of [installing, requested]) {
    await setAgentStarted(q, machineId, { publicKey: key, startedAt: new Date() });
    await requestOSInstallation(q, machineId, image);
  }
  // The agent's heartbeat takes the request: Delivered, the agent installing.
  await AgentHeartbeats.of(bmdb).answer({ machineId: installing, publicKey: key });
  const recovery = await session.work(Process.ShepherdRecovery, async () => [installing]);

  const held = await holdMachine(q, installing, { reason: 'disk swap', actor: 'tech@dc' });
  expect(held.liveWork).toEqual([Process.ShepherdRecovery]);
  expect(held.installing).toMatchObject({ machineId: installing, state: 'Delivered', generation: 1n });
  const onlyRequested = await holdMachine(q, requested, { reason: 'disk swap', actor: 'tech@dc' });
  expect(onlyRequested).toMatchObject({ placed: true, liveWork: [], installing: undefined });
  await recovery.cancel();

  const unknown = '00000000-0000-4000-8000-000000000000';
  const refused = holdMachine(q, unknown, { reason: 'x', actor: 'tech@dc' });
  await expect(refused).rejects.toBeInstanceOf(BMDBError);
  await expect(refused).rejects.toThrow(`hold of machine ${unknown}: machine ${unknown} is not in the BMDB`);
});
