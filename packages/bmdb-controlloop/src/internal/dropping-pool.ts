import type { PostgresPool, PostgresPoolClient } from 'kysely';
import type pg from 'pg';
import { isConnectionLost } from './connection-lost.js';

/**
 * `pool` as Kysely's pool, except that a connection one of whose queries
 * failed for a lost connection or a node that cannot write (a failover:
 * `connection-lost.ts`) is dropped when released, not handed out again.
 * Kysely releases a connection without its error, and a connection to a
 * node that became a standby would refuse every write it is given.
 */
export function droppingLostConnections(pool: pg.Pool): PostgresPool {
  return {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect();
      let lost: Error | undefined;
      const query = (...args: unknown[]): unknown => {
        const result = (client.query as (...a: unknown[]) => unknown)(...args);
        if (!(result instanceof Promise)) return result;
        return result.catch((error: unknown) => {
          if (isConnectionLost(error)) lost = error as Error;
          throw error;
        });
      };
      return { query: query as PostgresPoolClient['query'], release: () => client.release(lost) };
    },
    end: () => pool.end(),
  };
}
