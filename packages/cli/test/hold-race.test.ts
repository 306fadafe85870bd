/**
 * `shepherd hold`, spawned as a process, while claims are being taken: no
 * claim committed after the hold may be on the machine, and every claim
 * committed before it is named in the command's output; and what else it
 * names as running: an OS installation under way, in text and JSON.
 */
import { randomBytes } from 'node:crypto';
import { NothingToDoError, type Session, selectionFor, WorkConflictError } from '@bmaas/bmdb-controlloop';
import {
  AgentHeartbeats,
  addProvided,
  holdMachine,
  machineHold,
  newMachine,
  osInstallation,
  Process,
  requestOSInstallation,
  setAgentStarted,
} from '@bmaas/bmdb-model';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { holdsMeetingClaims, holdViolations, type ToldHold } from '../../../test/support/holds.js';
import { buildOnce, shepherd } from './helpers.js';

const { db, bmdb } = await testBMDB();
const sessions: Session[] = [];
const env = () => ({ SHEPHERD_BMDB_URL: db.url, SHEPHERD_ACTOR: 'alice@ops1', DEBUG: '' });

beforeAll(() => buildOnce());
afterAll(() => Promise.all(sessions.map((s) => s.close())));

const start = async (processor: string) => {
  const s = await bmdb.startSession({ processor });
  sessions.push(s);
  return s;
};

/** `count` machines of `provider`, provided, with their provider IDs. */
async function provide(session: Session, provider: string, count: number): Promise<string[]> {
  return session.transact(async (q) => {
    const ids: string[] = [];
    for (let i = 0; i < count; i++) {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider, providerId: `${provider.toLowerCase()}-${i + 1}` });
      ids.push(machineId);
    }
    return ids;
  });
}

describe('hold under claims', () => {
  test('no claim committed after `shepherd hold` is on the machine, and each one before it is named', async () => {
    const PROCESS = 'CliHoldRace';
    const machines = await provide(await start('cli-hold-race'), 'CliHoldRace', 24);
    const race = (order: 'asc' | 'desc') =>
      selectionFor(PROCESS, {
        query: bmdb.db
          .selectFrom('machine_provided')
          .select('machine_id')
          .where('provider', '=', 'CliHoldRace')
          .orderBy('machine_id', order),
        toCandidate: (row) => row.machine_id,
      });
    const claimers = await Promise.all(Array.from({ length: 6 }, () => start('cli-hold-race')));
    let holding = true;
    const claiming = claimers.map(async (s, i) => {
      // One claims on its own (a lone worker's statement), the others in batches.
      const selection = race(i === 0 ? 'desc' : 'asc');
      while (holding) {
        try {
          await (await s.work(PROCESS, selection)).finish();
        } catch (error) {
          if (!(error instanceof NothingToDoError || error instanceof WorkConflictError)) throw error;
        }
      }
    });

    const told: ToldHold[] = [];
    // Four operators with the CLI, four machines each, and one through holdMachine, at once.
    const byCli = async (ids: readonly string[]) => {
      const result = await shepherd(['hold', '--machine-id', ...ids, '--reason', 'hold race', '--json'], env());
      expect(result.stderr).toBe('');
      expect(result.code).toBe(0);
      const output = JSON.parse(result.stdout) as {
        held: { machineId: string; placed: boolean; liveWork: string[] }[];
      };
      expect(output.held.map((h) => [h.machineId, h.placed])).toEqual(ids.map((id) => [id, true]));
      told.push(...output.held);
    };
    const byQueries = async (ids: readonly string[]) => {
      for (const machineId of ids) {
        const { liveWork } = await holdMachine(bmdb.db, machineId, {
          reason: 'hold race',
          actor: 'q@race',
        });
        told.push({ machineId, liveWork });
      }
    };
    try {
      await Promise.all([
        ...[0, 1, 2, 3].map((i) => byCli(machines.slice(i * 4, i * 4 + 4))),
        byQueries(machines.slice(16)),
      ]);
    } finally {
      holding = false;
      await Promise.all(claiming);
    }
    expect(told).toHaveLength(machines.length);
    expect(await holdViolations(db, PROCESS, told)).toEqual([]);
    expect(holdsMeetingClaims(PROCESS, told)).toBeGreaterThan(0);
  });
});

describe('what hold names', () => {
  test('an OS installation under way (Delivered) beside the work running, in text and JSON', async () => {
    const session = await start('cli-hold-naming');
    const q = bmdb.db;
    const [text, json, requested] = (await provide(session, 'Naming', 3)) as [string, string, string];
    const key = new Uint8Array(randomBytes(32));
    for (const machineId of [text, json, requested]) {
      await setAgentStarted(q, machineId, { publicKey: key, startedAt: new Date() });
      await requestOSInstallation(q, machineId, {
        imageUrl: 'https://images.example.com/debian.img.gz',
        imageSha256: 'ab'.repeat(32),
        rootDevice: '/dev/sda',
        compression: 'gzip',
        actor: 'alice@ops1',
        reason: 'first install',
      });
    }
    // Their agents took the request in a heartbeat's answer: installing. The third's has not yet.
    await AgentHeartbeats.of(bmdb).answer({ machineId: text, publicKey: key });
    await AgentHeartbeats.of(bmdb).answer({ machineId: json, publicKey: key });
    const recovery = await session.work(Process.ShepherdRecovery, async () => [text]);

    const byText = await shepherd(
      ['hold', '--provider', 'Naming', '--provider-id', 'naming-1', 'naming-3', '--reason', 'disk swap'],
      env(),
    );
    expect(byText.code).toBe(0);
    expect(byText.stdout).toMatch(
      new RegExp(
        `^held Naming naming-1 \\(machine ${text}\\); work running on it: ShepherdRecovery, ` +
          'OS installation generation 1 of https://images\\.example\\.com/debian\\.img\\.gz ' +
          '\\(delivered \\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z\\) \\(it ends on its own\\)\\n' +
          `held Naming naming-3 \\(machine ${requested}\\)\\n$`,
      ),
    );
    await recovery.cancel();

    const byJson = await shepherd(['hold', '--machine-id', json, '--reason', 'disk swap', '--json'], env());
    expect(byJson.code).toBe(0);
    const delivered = await osInstallation(q, json);
    expect(JSON.parse(byJson.stdout)).toEqual({
      held: [
        {
          machineId: json,
          provider: 'Naming',
          providerId: 'naming-2',
          placed: true,
          actor: 'alice@ops1',
          reason: 'disk swap',
          since: (await machineHold(q, json))?.since.toISOString(),
          liveWork: [],
          installing: {
            generation: '1',
            imageUrl: 'https://images.example.com/debian.img.gz',
            deliveredAt: delivered?.deliveredAt?.toISOString(),
          },
        },
      ],
      unknown: [],
    });
  });
});
