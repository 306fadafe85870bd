import { randomBytes } from 'node:crypto';
import { BMDBError, ConnectionClosedError } from '@bmaas/bmdb-controlloop';
import { Registry } from 'prom-client';
import { describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { eventually } from '../../../test/support/wait.js';
import {
  AGENT_LOG_MAX_BYTES,
  AgentHeartbeats,
  hardwareReport,
  machineDetail,
  newMachine,
  osInstallationReport,
  setAgentStarted,
} from '../src/index.js';

const registry = new Registry();

const { db, bmdb } = await testBMDB({ metrics: registry });

/** A machine with an AgentStarted tag (started an hour ago) under a fresh key; returns its ID and key. */
async function startedMachine(): Promise<{ machineId: string; key: Uint8Array }> {
  const q = bmdb.db;
  const machineId = await newMachine(q);
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, { publicKey: key, startedAt: new Date(Date.now() - 3_600_000) });
  return { machineId, key };
}

const heartbeatAt = async (machineId: string) =>
  (await db.admin('SELECT agent_heartbeat_at FROM machine_agent_heartbeat WHERE machine_id = $1', [machineId])).rows[0]
    ?.agent_heartbeat_at as Date | undefined;

const dbNow = async () => (await db.admin('SELECT now() AS now')).rows[0].now as Date;

describe('AgentHeartbeats.record', () => {
  test('the right key records the heartbeat at the database’s now, and the hardware report as a tag', async () => {
    const { machineId, key } = await startedMachine();
    const hardware = new Uint8Array([0x0a, 0x02, 0x08, 0x01]);
    const installation = new Uint8Array([0x08, 0x07, 0x12, 0x00]);
    const before = await dbNow();
    expect(
      await AgentHeartbeats.of(bmdb).record({
        machineId,
        publicKey: key,
        hardwareReport: hardware,
        installationReport: { generation: 7n, result: 'Success', raw: installation },
      }),
    ).toBe('recorded');
    const at = await heartbeatAt(machineId);
    expect(at?.getTime()).toBeGreaterThanOrEqual(before.getTime());
    expect(at?.getTime()).toBeLessThanOrEqual((await dbNow()).getTime());

    const q = bmdb.db;
    const report = await hardwareReport(q, machineId);
    expect(Buffer.from(report?.raw ?? []).equals(Buffer.from(hardware))).toBe(true);
    expect(report?.reportedAt.getTime()).toBe(at?.getTime());
    // An installation report answering no request of the machine is ignored (see os-installation.test.ts).
    expect(await osInstallationReport(q, machineId)).toBeUndefined();

    // A heartbeat without reports keeps the stored ones.
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key })).toBe('recorded');
    expect((await hardwareReport(q, machineId))?.reportedAt.getTime()).toBe(at?.getTime());
    expect((await heartbeatAt(machineId))?.getTime()).toBeGreaterThanOrEqual(at?.getTime() ?? 0);
  });

  test('the agent’s log is stored in place of the last, kept by heartbeats without one, and shown in the detail', async () => {
    const { machineId, key } = await startedMachine();
    const q = bmdb.db;
    expect((await machineDetail(q, machineId))?.agentLog).toBeNull();
    const full = `${'é'.repeat(AGENT_LOG_MAX_BYTES / 2 - 1)}\n!`; // Exactly the bound, in bytes.
    expect(Buffer.byteLength(full)).toBe(AGENT_LOG_MAX_BYTES);
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key, agentLog: 'first\n' })).toBe('recorded');
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key, agentLog: full })).toBe('recorded');
    const at = await heartbeatAt(machineId);
    const stored = (await machineDetail(q, machineId))?.agentLog;
    expect(stored?.text).toBe(full);
    expect(stored?.receivedAt.getTime()).toBe(at?.getTime());
    // A heartbeat without a log (the log did not change) keeps it.
    expect(await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key })).toBe('recorded');
    expect((await machineDetail(q, machineId))?.agentLog).toEqual(stored);
    // Another key writes nothing.
    expect(
      await AgentHeartbeats.of(bmdb).record({ machineId, publicKey: new Uint8Array(32), agentLog: 'forged' }),
    ).toBe('unauthenticated');
    expect((await machineDetail(q, machineId))?.agentLog?.text).toBe(full);
  });

  test('a log longer than the bound, or holding a NUL, is refused naming the machine; the table refuses it too', async () => {
    const { machineId, key } = await startedMachine();
    await expect(
      AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key, agentLog: 'x'.repeat(AGENT_LOG_MAX_BYTES + 1) }),
    ).rejects.toThrow(
      new BMDBError(`agent heartbeat of machine ${machineId}: its log of 65537 bytes is longer than 65536`),
    );
    await expect(AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key, agentLog: 'a\0b' })).rejects.toThrow(
      new BMDBError(`agent heartbeat of machine ${machineId}: its log contains a NUL character`),
    );
    expect(await heartbeatAt(machineId)).toBeUndefined();
    await expect(
      db.admin(`INSERT INTO machine_agent_log VALUES ($1, repeat('x', 65537), now())`, [machineId]),
    ).rejects.toThrow(/machine_agent_log_agent_log_check/);
  });

  test('another key, an unknown machine or a machine without AgentStarted: unauthenticated, nothing written', async () => {
    const { machineId } = await startedMachine();
    const q = bmdb.db;
    const bare = await newMachine(q);
    const unknown = '00000000-0000-4000-8000-000000000000';
    const report = { hardwareReport: new Uint8Array([1]) };
    for (const id of [machineId, bare, unknown]) {
      expect(
        await AgentHeartbeats.of(bmdb).record({ machineId: id, publicKey: new Uint8Array(32).fill(9), ...report }),
      ).toBe('unauthenticated');
      expect(await heartbeatAt(id)).toBeUndefined();
      expect(await hardwareReport(q, id)).toBeUndefined();
    }
  });

  test('a malformed machine ID or a bad installation report is refused before anything is sent, naming it', async () => {
    const { machineId, key } = await startedMachine();
    await expect(AgentHeartbeats.of(bmdb).record({ machineId: 'machine-1', publicKey: key })).rejects.toThrow(
      new BMDBError('agent heartbeat: machine ID "machine-1" is not a UUID'),
    );
    await expect(
      AgentHeartbeats.of(bmdb).record({
        machineId,
        publicKey: key,
        installationReport: { generation: 2n ** 63n, result: 'Success', raw: new Uint8Array() },
      }),
    ).rejects.toThrow(/installation generation 9223372036854775808 is not a 64-bit integer/);
    expect(await heartbeatAt(machineId)).toBeUndefined();
  });

  test("a BMDB has one AgentHeartbeats, which callers share; a closed BMDB's refuses, rejecting", async () => {
    const own = await openTestBMDB(db);
    const heartbeats = AgentHeartbeats.of(own);
    expect(AgentHeartbeats.of(own)).toBe(heartbeats);
    expect(AgentHeartbeats.of(bmdb)).not.toBe(heartbeats);
    const { machineId, key } = await startedMachine();
    expect(await heartbeats.record({ machineId, publicKey: key })).toBe('recorded');
    await own.close();
    await expect(heartbeats.answer({ machineId, publicKey: key })).rejects.toThrow(ConnectionClosedError);
    const closed = await openTestBMDB(db);
    await closed.close();
    expect(() => AgentHeartbeats.of(closed)).toThrow(ConnectionClosedError);
  });

  test('concurrent heartbeats go as one statement, each answered by itself', async () => {
    // One after another: 40 concurrent serializable inserts into machines (its
    // triggers keep machine_unprovided) may fail each other under load.
    const machines: Awaited<ReturnType<typeof startedMachine>>[] = [];
    for (let i = 0; i < 40; i++) machines.push(await startedMachine());
    const batches = async () =>
      (await registry.getSingleMetricAsString('bmdb_agent_heartbeat_batch_size')).match(
        /bmdb_agent_heartbeat_batch_size_count (\d+)/,
      )?.[1];
    const before = Number(await batches());
    const results = await Promise.all(
      machines.map(({ machineId, key }, i) =>
        AgentHeartbeats.of(bmdb).record({ machineId, publicKey: i % 4 === 0 ? new Uint8Array(32) : key }),
      ),
    );
    expect(results).toEqual(machines.map((_, i) => (i % 4 === 0 ? 'unauthenticated' : 'recorded')));
    expect(Number(await batches()) - before).toBe(1);
    for (const [i, { machineId }] of machines.entries()) {
      expect(await heartbeatAt(machineId), `machine ${i}`).toEqual(i % 4 === 0 ? undefined : expect.any(Date));
    }
  });

  test('a heartbeat waits for a recovery deleting the AgentStarted tag, and is then refused', async () => {
    const { machineId, key } = await startedMachine();
    const { default: pg } = await import('pg');
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query('BEGIN');
      await client.query('DELETE FROM machine_agent_started WHERE machine_id = $1', [machineId]);
      const heartbeat = AgentHeartbeats.of(bmdb).record({ machineId, publicKey: key });
      // It waits on the deleted row's lock (the recovery has not committed).
      await eventually(async () =>
        (
          await db.admin(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
          )
        ).rowCount
          ? true
          : undefined,
      );
      await client.query('COMMIT');
      expect(await heartbeat).toBe('unauthenticated');
      expect(await heartbeatAt(machineId)).toBeUndefined();
    } finally {
      await client.end();
    }
  });
});
