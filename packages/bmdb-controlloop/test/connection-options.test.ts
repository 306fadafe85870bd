import { agentStartSelection, Process } from '@bmaas/bmdb-model';
import { sql } from 'kysely';
import { expect, test } from 'vitest';
import { createTestDatabase, openTestBMDB } from '../../../test/support/database.js';
import { provideMachines } from '../../../test/support/machines.js';

const db = await createTestDatabase();

test('pg connection options reach every connection: application_name and timeouts', async () => {
  const bmdb = await openTestBMDB(db, {
    componentName: 'os-installer',
    connection: { application_name: 'os-installer-eu1', statement_timeout: 1234, lock_timeout: 567 },
  });
  const settings = await sql<{ app: string; statement: string; lock: string }>`
    SELECT current_setting('application_name') AS app, current_setting('statement_timeout') AS statement,
           current_setting('lock_timeout') AS lock`.execute(bmdb.db);
  expect(settings.rows[0]).toEqual({ app: 'os-installer-eu1', statement: '1234ms', lock: '567ms' });
  // Claims and ends run on a pool of their own: its sessions carry the options too.
  const session = await bmdb.startSession({ processor: 'options' });
  await provideMachines(session, 1, 'Options');
  const work = await session.work(Process.ShepherdAgentStart, agentStartSelection(bmdb.db, { provider: 'Options' }));
  await work.finish();
  await session.close();
  const { rows } = await db.admin(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = 'os-installer-eu1'`,
    [db.name],
  );
  expect(rows[0].n).toBeGreaterThanOrEqual(2);
  // A statement running past the timeout is cancelled by the server.
  await expect(sql`SELECT pg_sleep(5)`.execute(bmdb.db)).rejects.toThrow(/statement timeout/);
});

test('without options, application_name is the component name', async () => {
  const bmdb = await openTestBMDB(db, { componentName: 'imaging' });
  const { rows } = await sql<{ app: string }>`SELECT current_setting('application_name') AS app`.execute(bmdb.db);
  expect(rows[0]?.app).toBe('imaging');
});
