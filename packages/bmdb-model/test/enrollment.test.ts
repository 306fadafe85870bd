import { createHash, randomUUID } from 'node:crypto';
import { NodeSchema } from '@bmaas/api/cloud/agent/api/hwreport_pb';
import { BMDBError, type Session } from '@bmaas/bmdb-controlloop';
import { Secret } from '@bmaas/common';
import { create, toBinary } from '@bufbuild/protobuf';
import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import pg from 'pg';
import { beforeAll, describe, expect, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';
import { eventually } from '../../../test/support/wait.js';
import {
  AgentHeartbeats,
  agentEnrollment,
  EnrollmentRefusedError,
  enrollAgent,
  hardwareReport,
  issueEnrollmentToken,
  newMachine,
  operatorHistory,
  renewEnrollmentToken,
  revokeEnrollmentToken,
} from '../src/index.js';

const { db, bmdb } = await testBMDB();
let session: Session;

beforeAll(async () => {
  session = await bmdb.startSession();
});

const key = (byte: number) => new Uint8Array(32).fill(byte);

/** An AgentHardwareReport (report = 1) around a node with 8 threads, as the agent sends it. */
const report = new BinaryWriter()
  .tag(1, WireType.LengthDelimited)
  .bytes(toBinary(NodeSchema, create(NodeSchema, { manufacturer: 'Dell Inc.', cpu: [{ hardwareThreads: 8 }] })))
  .finish();

async function machine(): Promise<string> {
  const [machineId] = (await provideMachines(session, 1, 'Enroll')) as [string];
  return machineId;
}

async function refusal(enrolling: Promise<unknown>): Promise<EnrollmentRefusedError> {
  const error = await enrolling.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(EnrollmentRefusedError);
  return error as EnrollmentRefusedError;
}

async function agentStarted(machineId: string): Promise<string | undefined> {
  const { rows } = await db.admin(
    'SELECT encode(agent_public_key, $2) AS key FROM machine_agent_started WHERE machine_id = $1',
    [machineId, 'hex'],
  );
  return rows[0]?.key;
}

/**
 * `call`'s outcome, failing if it waited for a lock first: raced against
 * any session of this database waiting for one.
 */
async function withoutWaiting<T>(call: Promise<T>): Promise<T> {
  let settled = false;
  const outcome = call.finally(() => {
    settled = true;
  });
  outcome.catch(() => {});
  const first = await eventually('the call answered, or waiting for a lock', async () => {
    if (settled) return 'answered';
    const { rowCount } = await db.admin(
      `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
    );
    return rowCount ? 'waiting' : undefined;
  });
  expect(first).toBe('answered');
  return outcome;
}

async function enrollments(machineId: string) {
  return (await operatorHistory(bmdb.db, machineId)).filter((entry) => entry.action === 'EnrollAgent');
}

describe('issueEnrollmentToken', () => {
  test('issues 32 random bytes, base64url, stored as their sha256 only, expiring by the database clock', async () => {
    const machineId = await machine();
    const issued = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    expect(issued.machineId).toBe(machineId);
    expect(issued.token).toBeInstanceOf(Secret);
    expect(String(issued.token)).not.toContain(issued.token.reveal());
    expect(Buffer.from(issued.token.reveal(), 'base64url')).toHaveLength(32);
    const { rows } = await db.admin(
      `SELECT encode(token_sha256, 'hex') AS sha, expires_at - issued_at AS validity, row_to_json(e)::text AS row
       FROM machine_agent_enrollment e WHERE machine_id = $1`,
      [machineId],
    );
    expect(rows[0].sha).toBe(createHash('sha256').update(issued.token.reveal()).digest('hex'));
    expect(rows[0].validity).toEqual({ minutes: 10 });
    expect(rows[0].row).not.toContain(issued.token.reveal());
    const state = await agentEnrollment(bmdb.db, machineId);
    expect(state?.expiresAt).toEqual(issued.expiresAt);
    expect(state?.enrolledAt).toBeUndefined();
    const other = await issueEnrollmentToken(bmdb.db, await machine(), { validForSeconds: 600 });
    expect(other.token.reveal()).not.toBe(issued.token.reveal());
  });

  test('refuses a machine that does not exist and a validity under a second, naming the machine', async () => {
    const missing = '00000000-0000-4000-8000-000000000000';
    await expect(issueEnrollmentToken(bmdb.db, missing, { validForSeconds: 60 })).rejects.toThrow(
      new BMDBError(`enrollment token for machine ${missing}: no such machine`),
    );
    const machineId = await machine();
    await expect(issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 0 })).rejects.toThrow(machineId);
    await expect(issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 1e-7 })).rejects.toThrow(
      `enrollment token for machine ${machineId}: validForSeconds must be at least 1 second, got 1e-7`,
    );
    await expect(issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: Number.NaN })).rejects.toThrow(BMDBError);
    expect(await agentEnrollment(bmdb.db, machineId)).toBeUndefined();
  });
});

describe('a boot’s token', () => {
  test('is renewed for the wait and revoked at its end, that boot’s alone: a later boot’s token is left as it is', async () => {
    const machineId = await machine();
    const [first, later] = [randomUUID(), randomUUID()];
    const issued = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 60, bootId: first });
    expect((await agentEnrollment(bmdb.db, machineId))?.bootId).toBe(first);
    // An hour of BMC calls: the token issued before them expired; renewed, it is good for the wait again.
    await db.admin(
      `UPDATE machine_agent_enrollment SET issued_at = issued_at - interval '1 hour', expires_at = expires_at - interval '1 hour' WHERE machine_id = $1`,
      [machineId],
    );
    const renewed = await renewEnrollmentToken(bmdb.db, machineId, first, { validForSeconds: 60 });
    expect(renewed?.getTime()).toBeGreaterThan(issued.expiresAt.getTime() - 1_000);
    // A later boot (the first one's claim lost) issues its own; the first one's end touches it not.
    const second = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 60, bootId: later });
    expect(await revokeEnrollmentToken(bmdb.db, machineId, first)).toBe(false);
    expect(await renewEnrollmentToken(bmdb.db, machineId, first, { validForSeconds: 600 })).toBeUndefined();
    expect((await agentEnrollment(bmdb.db, machineId))?.expiresAt).toEqual(second.expiresAt);
    // Its own end revokes it at once: refused as expired.
    expect(await revokeEnrollmentToken(bmdb.db, machineId, later)).toBe(true);
    expect(await revokeEnrollmentToken(bmdb.db, machineId, later)).toBe(false);
    const refused = await enrollAgent(bmdb.db, {
      machineId,
      token: second.token.reveal(),
      agentPublicKey: key(7),
    }).catch((e: unknown) => e);
    expect((refused as EnrollmentRefusedError).reason).toBe('Expired');
  });

  test('used, it is neither renewed nor revoked', async () => {
    const machineId = await machine();
    const bootId = randomUUID();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 60, bootId });
    await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(8) });
    expect(await revokeEnrollmentToken(bmdb.db, machineId, bootId)).toBe(false);
    expect(await renewEnrollmentToken(bmdb.db, machineId, bootId, { validForSeconds: 60 })).toBeUndefined();
    expect((await agentEnrollment(bmdb.db, machineId))?.enrolledAt).toBeInstanceOf(Date);
  });

  test('a boot ID that is no UUID is refused naming the machine', async () => {
    const machineId = await machine();
    await expect(issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 60, bootId: 'boot-1' })).rejects.toThrow(
      `enrollment token for machine ${machineId}: boot ID "boot-1" is no UUID`,
    );
  });
});

describe('enrollAgent', () => {
  test('sets AgentStarted with the key, stores the hardware report and marks the token used, recorded as Succeeded', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(7), hardwareReport: report });
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(7)).toString('hex'));
    expect((await hardwareReport(bmdb.db, machineId))?.raw).toEqual(Buffer.from(report));
    // With its totals, for the fleet's hardware gauges, as a heartbeat stores it.
    const totals = await db.admin(
      'SELECT cpu_threads::int AS threads FROM machine_hardware_report WHERE machine_id = $1',
      [machineId],
    );
    expect(totals.rows).toEqual([{ threads: 8 }]);
    expect((await agentEnrollment(bmdb.db, machineId))?.enrolledAt).toBeInstanceOf(Date);
    const [entry, ...more] = await enrollments(machineId);
    expect(more).toEqual([]);
    expect(entry).toMatchObject({ outcome: 'Succeeded', actor: 'bmaas-agent', cause: null });
    // The heartbeats of that key are accepted, as after a takeover.
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key(7) })).toBe('recorded');
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key(8) })).toBe('unauthenticated');
  });

  test("a machine booted again because its agent went silent loses the old agent's heartbeat with the new key", async () => {
    const machineId = await machine();
    const first = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId, token: first.token.reveal(), agentPublicKey: key(1) });
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key(1) })).toBe('recorded');
    const heartbeats = () => db.admin('SELECT 1 FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId]);
    expect((await heartbeats()).rows).toHaveLength(1);
    // Booted into the agent again: the stale heartbeat was the old agent's, not the new one's.
    const second = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId, token: second.token.reveal(), agentPublicKey: key(2) });
    expect((await heartbeats()).rows).toHaveLength(0);
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(2)).toString('hex'));
  });

  test('refuses a wrong token, and records the refusal with its reason, never the token', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    const wrong = `${token.reveal().slice(0, -1)}${token.reveal().endsWith('A') ? 'B' : 'A'}`;
    const error = await refusal(enrollAgent(bmdb.db, { machineId, token: wrong, agentPublicKey: key(1) }));
    expect(error).toMatchObject({ machine: machineId, reason: 'WrongToken' });
    expect(error.message).toBe(
      `enrollment of machine ${machineId} refused: the enrollment token is not the one issued for it`,
    );
    expect(error.message).not.toContain(wrong);
    expect(await agentStarted(machineId)).toBeUndefined();
    const [entry] = await enrollments(machineId);
    expect(entry).toMatchObject({ outcome: 'Refused', cause: error.message, detail: { reason: 'WrongToken' } });
    expect(JSON.stringify(await enrollments(machineId))).not.toContain(wrong);
    // The right token still works: a wrong guess does not use it up.
    await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(1) });
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(1)).toString('hex'));
  });

  test('refuses an expired token (time moved in the database)', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await db.admin(
      `UPDATE machine_agent_enrollment SET issued_at = now() - interval '11 minutes', expires_at = now() - interval '1 minute'
       WHERE machine_id = $1`,
      [machineId],
    );
    const error = await refusal(enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(2) }));
    expect(error).toMatchObject({ machine: machineId, reason: 'Expired' });
    expect(await agentStarted(machineId)).toBeUndefined();
    expect((await agentEnrollment(bmdb.db, machineId))?.enrolledAt).toBeUndefined();
    expect((await enrollments(machineId)).map((e) => e.detail)).toEqual([{ reason: 'Expired' }]);
  });

  test('refuses a token used already, keeping the first agent', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(3) });
    const error = await refusal(enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(4) }));
    expect(error).toMatchObject({ machine: machineId, reason: 'Used' });
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(3)).toString('hex'));
    expect((await enrollments(machineId)).map((e) => e.outcome)).toEqual(['Succeeded', 'Refused']);
  });

  test("refuses another machine's token", async () => {
    const [mine, theirs] = [await machine(), await machine()];
    await issueEnrollmentToken(bmdb.db, mine, { validForSeconds: 600 });
    const { token } = await issueEnrollmentToken(bmdb.db, theirs, { validForSeconds: 600 });
    const error = await refusal(
      enrollAgent(bmdb.db, { machineId: mine, token: token.reveal(), agentPublicKey: key(5) }),
    );
    expect(error).toMatchObject({ machine: mine, reason: 'WrongToken' });
    expect(await agentStarted(mine)).toBeUndefined();
    expect((await enrollments(theirs)).length).toBe(0);
    // Theirs is still good for them.
    await enrollAgent(bmdb.db, { machineId: theirs, token: token.reveal(), agentPublicKey: key(5) });
  });

  test('refuses a machine with no token issued, and one that does not exist (recorded only for the one that does)', async () => {
    const machineId = await machine();
    const error = await refusal(enrollAgent(bmdb.db, { machineId, token: 'x', agentPublicKey: key(6) }));
    expect(error).toMatchObject({ machine: machineId, reason: 'NoToken' });
    expect((await enrollments(machineId)).map((e) => e.detail)).toEqual([{ reason: 'NoToken' }]);
    for (const missing of ['00000000-0000-4000-8000-000000000000', 'not-a-machine']) {
      const none = await refusal(enrollAgent(bmdb.db, { machineId: missing, token: 'x', agentPublicKey: key(6) }));
      expect(none).toMatchObject({ machine: missing, reason: 'NoToken' });
    }
    const { rows } = await db.admin(
      `SELECT count(*)::int AS n FROM operator_history WHERE machine_id::text LIKE '00000000%'`,
    );
    expect(rows).toEqual([{ n: 0 }]);
  });

  test('a new token replaces the earlier one, used or not', async () => {
    const machineId = await machine();
    const first = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    const second = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    const error = await refusal(
      enrollAgent(bmdb.db, { machineId, token: first.token.reveal(), agentPublicKey: key(9) }),
    );
    expect(error.reason).toBe('WrongToken');
    await enrollAgent(bmdb.db, { machineId, token: second.token.reveal(), agentPublicKey: key(9) });
    // Issued again after use: the next boot's agent enrolls with the new one.
    const third = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    expect((await agentEnrollment(bmdb.db, machineId))?.enrolledAt).toBeUndefined();
    await enrollAgent(bmdb.db, { machineId, token: third.token.reveal(), agentPublicKey: key(10) });
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(10)).toString('hex'));
  });

  test('of concurrent enrollments with one token, exactly one wins, and its key is the one stored', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    const keys = Array.from({ length: 8 }, (_, i) => key(100 + i));
    const results = await Promise.allSettled(
      keys.map((agentPublicKey) => enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey })),
    );
    const won = results.flatMap((result, i) => (result.status === 'fulfilled' ? [i] : []));
    expect(won).toHaveLength(1);
    for (const result of results) {
      if (result.status === 'rejected') expect(result.reason).toMatchObject({ machine: machineId, reason: 'Used' });
    }
    expect(await agentStarted(machineId)).toBe(Buffer.from(keys[won[0] as number] as Uint8Array).toString('hex'));
    // The seven refusals in one entry: the others found it (or its writer at work) and wrote nothing.
    expect((await enrollments(machineId)).map((e) => e.outcome).sort()).toEqual(['Refused', 'Succeeded']);
  });

  test('the used token presented again with the key it enrolled is answered as the first was, writing nothing', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    expect(await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(12) })).toBe('enrolled');
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key(12) })).toBe('recorded');
    const written = async () =>
      (
        await db.admin(
          `SELECT (SELECT row_to_json(e)::text FROM machine_agent_enrollment e WHERE machine_id = $1) AS enrollment,
             (SELECT row_to_json(a)::text FROM machine_agent_started a WHERE machine_id = $1) AS started,
             (SELECT count(*)::int FROM machine_agent_heartbeat WHERE machine_id = $1) AS heartbeats,
             (SELECT count(*)::int FROM operator_history WHERE machine_id = $1) AS history`,
          [machineId],
        )
      ).rows[0];
    const before = await written();
    // The answer was lost: the agent asks again with its token and key, even once the token expired.
    expect(await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(12) })).toBe('repeated');
    await db.admin(
      `UPDATE machine_agent_enrollment SET expires_at = now() - interval '1 second',
      issued_at = now() - interval '1 hour' WHERE machine_id = $1`,
      [machineId],
    );
    expect(await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(12) })).toBe('repeated');
    const after = await written();
    expect({ ...after, enrollment: undefined }).toEqual({ ...before, enrollment: undefined });
    // Another key with that token is refused: the token enrolled one agent.
    const error = await refusal(enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(13) }));
    expect(error).toMatchObject({ machine: machineId, reason: 'Used' });
    expect(await agentStarted(machineId)).toBe(Buffer.from(key(12)).toString('hex'));
    expect((await enrollments(machineId)).map((e) => e.outcome)).toEqual(['Succeeded', 'Refused']);
  });

  test('refusals of a machine are recorded once a minute after its last enrollment entry; the others write nothing', async () => {
    const machineId = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    for (let i = 0; i < 20; i++) {
      await refusal(enrollAgent(bmdb.db, { machineId, token: `wrong-${i}`, agentPublicKey: key(14) }));
    }
    expect((await enrollments(machineId)).map((e) => [e.outcome, e.detail])).toEqual([
      ['Refused', { reason: 'WrongToken' }],
    ]);
    // A minute later (moved in the database), the next refusal is recorded, with its own reason.
    await db.admin(
      `UPDATE operator_history SET "timestamp" = "timestamp" - interval '61 seconds' WHERE machine_id = $1`,
      [machineId],
    );
    await db.admin(
      `UPDATE machine_agent_enrollment SET expires_at = now() - interval '1 second',
      issued_at = now() - interval '1 hour' WHERE machine_id = $1`,
      [machineId],
    );
    for (let i = 0; i < 5; i++) {
      await refusal(enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(14) }));
    }
    expect((await enrollments(machineId)).map((e) => e.detail)).toEqual([
      { reason: 'WrongToken' },
      { reason: 'Expired' },
    ]);
    // An enrollment between refusals is recorded, and the refusal after it too.
    const fresh = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId, token: fresh.token.reveal(), agentPublicKey: key(15) });
    await refusal(enrollAgent(bmdb.db, { machineId, token: fresh.token.reveal(), agentPublicKey: key(16) }));
    await refusal(enrollAgent(bmdb.db, { machineId, token: 'wrong', agentPublicKey: key(16) }));
    expect((await enrollments(machineId)).map((e) => e.outcome)).toEqual([
      'Refused',
      'Refused',
      'Succeeded',
      'Refused',
    ]);
    for (const entry of await enrollments(machineId)) {
      if (entry.outcome === 'Refused') expect(entry.cause).toContain(`enrollment of machine ${machineId} refused`);
    }
  });

  test('a refusal waits for no lock: wrong, used and expired tokens answered while another holds the machine rows', async () => {
    const machineId = await machine();
    const used = await machine();
    const expired = await machine();
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    const usedToken = await issueEnrollmentToken(bmdb.db, used, { validForSeconds: 600 });
    await enrollAgent(bmdb.db, { machineId: used, token: usedToken.token.reveal(), agentPublicKey: key(17) });
    const expiredToken = await issueEnrollmentToken(bmdb.db, expired, { validForSeconds: 600 });
    await db.admin(
      `UPDATE machine_agent_enrollment SET expires_at = now() - interval '1 second',
      issued_at = now() - interval '1 hour' WHERE machine_id = $1`,
      [expired],
    );
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    try {
      // As an enrollment under way, or a token being issued, holds them.
      await holder.query('BEGIN');
      await holder.query(
        `SELECT 1 FROM machine_agent_enrollment e JOIN machines m USING (machine_id)
         WHERE machine_id = ANY ($1::uuid[]) FOR UPDATE`,
        [[machineId, used, expired]],
      );
      for (let i = 0; i < 3; i++) {
        const wrong = await refusal(
          withoutWaiting(enrollAgent(bmdb.db, { machineId, token: `${token.reveal()}x`, agentPublicKey: key(18) })),
        );
        expect(wrong.reason).toBe('WrongToken');
        const again = await refusal(
          withoutWaiting(
            enrollAgent(bmdb.db, { machineId: used, token: usedToken.token.reveal(), agentPublicKey: key(18) }),
          ),
        );
        expect(again.reason).toBe('Used');
        const late = await refusal(
          withoutWaiting(
            enrollAgent(bmdb.db, { machineId: expired, token: expiredToken.token.reveal(), agentPublicKey: key(18) }),
          ),
        );
        expect(late.reason).toBe('Expired');
      }
      // The repeat of an enrollment, too.
      expect(
        await withoutWaiting(
          enrollAgent(bmdb.db, { machineId: used, token: usedToken.token.reveal(), agentPublicKey: key(17) }),
        ),
      ).toBe('repeated');
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
    await enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(18) });
  });

  test('an installed machine is refused its agent and keeps its token unused', async () => {
    const machineId = await newMachine(bmdb.db);
    await db.admin(
      `INSERT INTO machine_os_installation_request (machine_id, generation, image_url, image_sha256, root_device,
         compression, requested_by, installation_state)
       VALUES ($1, 1, 'https://images.example.com/os.img', $2, '/dev/sda', 'none', 'tech', 'Succeeded')`,
      [machineId, 'ab'.repeat(32)],
    );
    const { token } = await issueEnrollmentToken(bmdb.db, machineId, { validForSeconds: 600 });
    await expect(enrollAgent(bmdb.db, { machineId, token: token.reveal(), agentPublicKey: key(11) })).rejects.toThrow(
      `machine ${machineId} is installed`,
    );
    expect((await agentEnrollment(bmdb.db, machineId))?.enrolledAt).toBeUndefined();
  });
});
