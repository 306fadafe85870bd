/**
 * What a failover does to the library's statements, on a real PostgreSQL: a
 * node that stopped being the primary refuses writes (25006), as a database
 * set read-only for new connections does here. The refusal is named a
 * failover in the log, counted in `bmdb_connection_lost_total`, and retried
 * on a fresh connection until a writable node takes it, through both pools
 * (a transaction through Kysely, an end through the prepared statements).
 */

import { Process } from '@bmaas/bmdb-model';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterEach, expect, inject, test } from 'vitest';
import { testBMDB } from '../../../test/support/database.js';
import { captureDebugLog } from '../../../test/support/debug-log.js';
import { provideMachines } from '../../../test/support/machines.js';
import { eventually } from '../../../test/support/wait.js';
import { connectionLoss } from '../src/internal/connection-lost.js';

const registry = new Registry();
const COMPONENT = 'failover-errors';
const { db, bmdb } = await testBMDB({ metrics: registry, componentName: COMPONENT });

afterEach(() => db.admin(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`));

/** `bmdb_connection_lost_total` of `cause`, summed over processors. */
async function lost(cause: string): Promise<number> {
  const metric = await registry.getSingleMetric('bmdb_connection_lost_total')?.get();
  return (metric?.values ?? []).filter((v) => v.labels.cause === cause).reduce((sum, v) => sum + v.value, 0);
}

/** New connections to the database are read-only, and this BMDB's open ones are cut: a node turned standby. */
async function becomeReadOnly(): Promise<void> {
  await db.admin(`ALTER DATABASE ${db.name} SET default_transaction_read_only = on`);
  const cut = await db.admin(
    'SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2',
    [db.name, COMPONENT],
  );
  // Until each cut backend is gone its goodbye (57P01) may still be on its way to an idle pooled
  // connection, and a statement handed that connection gets it instead of the read-only refusal.
  // Asked on the server's admin database: a new connection to this one would be read-only too.
  const pids = cut.rows.map((row) => row.pid as number);
  const admin = new pg.Client({ connectionString: inject('bmdbAdminUrl') });
  await admin.connect();
  try {
    await eventually('the cut connections gone', async () => {
      const left = await admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ANY($1)', [pids]);
      return left.rows[0]?.n === 0 || undefined;
    });
  } finally {
    await admin.end();
  }
}

test('the errors a failover produces are named by cause; others are not', async () => {
  const refused = await db
    .admin('BEGIN READ ONLY; CREATE TEMPORARY TABLE t (x int); COMMIT')
    .catch((error: unknown) => error);
  expect(connectionLoss(refused)).toBe('read_only');
  const shutdown = await db.admin(`SELECT pg_terminate_backend(pg_backend_pid())`).catch((error: unknown) => error);
  expect(connectionLoss(shutdown)).toBe('admin_shutdown');
  const syntax = await db.admin('SELEC 1').catch((error: unknown) => error);
  expect(connectionLoss(syntax)).toBeUndefined();
  expect(connectionLoss(new Error('Connection terminated unexpectedly'))).toBe('connection_lost');
});

test('a transaction refused by a read-only node is retried on a fresh connection once a primary takes it, named a failover and counted', async () => {
  const session = await bmdb.startSession({ processor: 'failover-test', interval: 10_000 });
  await provideMachines(session, 1, 'Warm');
  const log = captureDebugLog('bmdb:connection');
  try {
    await becomeReadOnly();
    const provided = provideMachines(session, 1, 'Failover');
    await eventually('a read-only refusal counted', async () => ((await lost('read_only')) > 0 ? true : undefined));
    await db.admin(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`);
    const [machineId] = await provided;
    const rows = await db.admin('SELECT provider FROM machine_provided WHERE machine_id = $1', [machineId]);
    expect(rows.rows).toEqual([{ provider: 'Failover' }]);
    expect(
      log.lines.some((line) => /BMDB failover: the node is read-only .*retrying on a fresh connection/.test(line)),
    ).toBe(true);
  } finally {
    log.restore();
    await session.close();
  }
});

test('an end refused by a read-only node is retried on a fresh connection and recorded once', async () => {
  const session = await bmdb.startSession({ processor: 'failover-test', interval: 10_000 });
  const [machineId] = (await provideMachines(session, 1, 'FailoverEnd')) as [string];
  const work = await session.work(Process.ShepherdAgentStart, async () => [machineId]);
  const before = await lost('read_only');
  try {
    await becomeReadOnly();
    const finished = work.finish({ set: { agentStarted: { publicKey: new Uint8Array(32) } } });
    await eventually('a read-only refusal counted', async () =>
      (await lost('read_only')) > before ? true : undefined,
    );
    await db.admin(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`);
    await finished;
    const history = await db.admin('SELECT event FROM work_history WHERE machine_id = $1 ORDER BY "timestamp"', [
      machineId,
    ]);
    expect(history.rows.map((r) => r.event)).toEqual(['Started', 'Finished']);
    expect(session.state).toBe('live');
  } finally {
    await session.close();
  }
});
