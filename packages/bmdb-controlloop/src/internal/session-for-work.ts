import { CompiledQuery, type Kysely, type RawBuilder, sql } from 'kysely';
import { BMDBError, type WorkOutcome } from '../errors.js';
import type { Database } from '../schema.js';
import type { EndRequest } from '../sql/end-work.js';
import type { Work, WorkSession } from '../work.js';
import { isConnectionLost } from './connection-lost.js';
import type { SessionConnection } from './session-connection.js';

/**
 * Runs `fn` in a transaction on `db` (one connection) whose `BEGIN` and first
 * statement go in one simple query: a round trip less than Kysely's
 * `transaction()`. The transaction's level is the connection's default.
 */
async function openedBy<T>(
  db: Kysely<Database>,
  opening: RawBuilder<unknown>,
  fn: (trx: Kysely<Database>) => Promise<T>,
): Promise<T> {
  const first = opening.compile(db);
  if (first.parameters.length > 0) throw new BMDBError('a transaction-opening statement must inline its values');
  try {
    await db.executeQuery(CompiledQuery.raw(`BEGIN; ${first.sql}`));
    const result = await fn(db);
    await db.executeQuery(CompiledQuery.raw('COMMIT'));
    return result;
  } catch (error) {
    // After a failed COMMIT there is no transaction left: PostgreSQL only warns.
    await db.executeQuery(CompiledQuery.raw('ROLLBACK')).catch(() => undefined);
    throw error;
  }
}

/** The session as its {@link Work} sees it: its liveness, transactions and ends. */
export class SessionForWork implements WorkSession {
  constructor(
    private readonly connection: SessionConnection,
    readonly sessionId: string,
    private readonly processor: string,
    readonly signal: AbortSignal,
    private readonly session: {
      assertLive(): void;
      workEnded(work: Work, outcome: WorkOutcome): void;
    },
  ) {}

  assertLive(): void {
    this.session.assertLive();
  }

  transaction<T>(fn: (trx: Kysely<Database>) => Promise<T>): Promise<T> {
    return this.connection.retry(this.processor, () => this.connection.db.transaction().execute(fn));
  }

  transactionOpenedBy<T>(opening: RawBuilder<unknown>, fn: (trx: Kysely<Database>) => Promise<T>): Promise<T> {
    return this.connection.retry(this.processor, () =>
      this.connection.db.connection().execute((db) => openedBy(db, opening, fn)),
    );
  }

  end(request: Omit<EndRequest, 'sessionId' | 'processor'>): Promise<boolean> {
    return this.connection.ends.end({ ...request, sessionId: this.sessionId, processor: this.processor });
  }

  async aliveInDatabase(): Promise<boolean | undefined> {
    try {
      const row = await this.connection.db
        .selectFrom('sessions')
        .select(sql<boolean>`deadline > now()`.as('alive'))
        .where('session_id', '=', this.sessionId)
        .executeTakeFirst();
      return row?.alive === true;
    } catch (error) {
      if (isConnectionLost(error)) return undefined;
      throw error;
    }
  }

  workEnded(work: Work, outcome: WorkOutcome): void {
    this.session.workEnded(work, outcome);
  }
}
