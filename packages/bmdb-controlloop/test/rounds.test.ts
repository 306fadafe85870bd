import { afterAll, describe, expect, test } from 'vitest';
import { openTestBMDB, testBMDB } from '../../../test/support/database.js';
import { TcpProxy } from '../../../test/support/tcp-proxy.js';
import { eventually } from '../../../test/support/wait.js';
import { runRounds, type Session, SessionExpiredError } from '../src/index.js';

const { db, bmdb } = await testBMDB();
const { proxy, url: proxiedUrl } = await TcpProxy.for(db.url);
afterAll(() => proxy.close());

/** The sessions of `processor` in the database. */
async function sessionsOf(processor: string): Promise<string[]> {
  const { rows } = await db.admin('SELECT session_id FROM sessions WHERE processor = $1', [processor]);
  return rows.map((row: { session_id: string }) => row.session_id);
}

describe('runRounds', () => {
  test('runs rounds in one live session until stopped, then closes it', async () => {
    const stop = new AbortController();
    const seen: Session[] = [];
    const failures: unknown[] = [];
    const running = runRounds(
      { signal: stop.signal, session: { bmdb, processor: 'rounds-live' }, onFailure: (error) => failures.push(error) },
      async (session) => {
        seen.push(session);
        expect(session.state).toBe('live');
        if (seen.length === 3) stop.abort();
      },
    );
    await running;
    expect(seen).toHaveLength(3);
    expect(new Set(seen).size).toBe(1);
    expect(seen[0]?.state).toBe('closed');
    expect(await sessionsOf('rounds-live')).toEqual([]);
    expect(failures).toEqual([]);
  });

  test('reports a failed round and tries the next; a round whose session expired gets a new one', async () => {
    const stop = new AbortController();
    const seen: Session[] = [];
    const failures: unknown[] = [];
    await runRounds(
      {
        signal: stop.signal,
        session: { bmdb, processor: 'rounds-expiring' },
        onFailure: (error, during) => failures.push([during, error]),
      },
      async (session) => {
        seen.push(session);
        if (seen.length === 1) {
          // The database collects it; the session learns so on its next statement.
          await db.admin(`UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1`, [
            session.id,
          ]);
          await session.transact(async () => undefined);
        }
        if (seen.length === 2) throw new Error('second round failed');
        if (seen.length === 3) stop.abort();
      },
    );
    expect(failures).toHaveLength(2);
    expect(failures[0]).toEqual(['round', expect.any(SessionExpiredError)]);
    expect(failures[1]).toEqual(['round', new Error('second round failed')]);
    const [first, second, third] = seen as [Session, Session, Session];
    expect(second).not.toBe(first);
    expect(first.state).not.toBe('live');
    // A round that failed with its session still live keeps it.
    expect(third).toBe(second);
    expect(await sessionsOf('rounds-expiring')).toEqual([]);
  });

  test('without a session, rounds get none; a stop while waiting ends the loop quietly', async () => {
    const stop = new AbortController();
    let rounds = 0;
    const failures: unknown[] = [];
    const running = runRounds(
      {
        signal: stop.signal,
        // Each round waits for the stop after the second: a wait rejecting with the signal's reason is a stop.
        before: (signal) =>
          rounds < 2
            ? Promise.resolve()
            : new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason))),
        onFailure: (error) => failures.push(error),
      },
      async () => {
        rounds++;
      },
    );
    await eventually('two rounds', async () => (rounds === 2 ? true : undefined));
    stop.abort();
    await running;
    expect(rounds).toBe(2);
    expect(failures).toEqual([]);
  });

  test('ends quietly once the BMDB is closed under it', async () => {
    const own = await openTestBMDB(db, { componentName: 'rounds-closed' });
    const failures: unknown[] = [];
    let rounds = 0;
    await runRounds(
      {
        signal: new AbortController().signal,
        session: { bmdb: own, processor: 'rounds-closed' },
        onFailure: (error) => failures.push(error),
      },
      async () => {
        rounds++;
        await own.close();
      },
    );
    expect(rounds).toBe(1);
    expect(failures).toEqual([]);
  });

  test('reports a session it could not close, and does not throw', async () => {
    proxy.restore();
    const flaky = await openTestBMDB(db, { url: proxiedUrl, componentName: 'rounds-unclosable' });
    const stop = new AbortController();
    const failures: [string, unknown][] = [];
    await runRounds(
      {
        signal: stop.signal,
        session: { bmdb: flaky, processor: 'rounds-unclosable' },
        onFailure: (error, during) => failures.push([during, error]),
      },
      async () => {
        proxy.cut();
        stop.abort();
      },
    );
    expect(failures.map(([during]) => during)).toEqual(['close']);
    proxy.restore();
  });
});
