import type { PostgresPool, PostgresPoolClient } from 'kysely';
import pg from 'pg';

/**
 * One PostgreSQL connection as a Kysely pool: every query goes over it, and
 * once it fails or ends it stays lost (a pool would quietly open another).
 * For state that lives and dies with a connection, such as an advisory lock.
 */
export class SingleConnection implements PostgresPool {
  readonly #client: pg.Client;
  #lost: Error | undefined;
  #ended = false;

  /** `onLost` is told once when the connection fails or ends, unless {@link end} ended it. */
  constructor(config: pg.ClientConfig, onLost: (error: Error) => void) {
    this.#client = new pg.Client(config);
    const lost = (error: Error) => {
      if (this.#lost !== undefined) return;
      this.#lost = error;
      if (!this.#ended) onLost(error);
    };
    this.#client.on('error', lost);
    this.#client.on('end', () => lost(new Error('the connection ended')));
  }

  /** Why the connection is gone, if it is. */
  get lost(): Error | undefined {
    return this.#lost;
  }

  async open(): Promise<void> {
    await this.#client.connect();
  }

  async connect(): Promise<PostgresPoolClient> {
    if (this.#lost) throw this.#lost;
    const client = this.#client;
    return {
      query: client.query.bind(client) as PostgresPoolClient['query'],
      release: () => {},
    };
  }

  /** Closes the connection (what it holds is released); idempotent, and quiet about a connection already lost. */
  async end(): Promise<void> {
    if (this.#ended) return;
    this.#ended = true;
    this.#lost ??= new Error('the connection was closed');
    await this.#client.end().catch(() => {});
  }
}
