import { Socket } from 'node:net';
import type { PostgresPool, PostgresPoolClient } from 'kysely';
import pg from 'pg';

/**
 * One PostgreSQL connection as a Kysely pool: every query goes over it, and
 * once it fails or ends it stays lost (a pool would quietly open another).
 * For state that lives and dies with a connection, such as an advisory lock.
 */
export class SingleConnection implements PostgresPool {
  readonly #client: pg.Client;
  /** The connection's TCP socket (under TLS, if any), made here so it can be destroyed whatever the protocol's state. */
  #socket: Socket | undefined;
  #lost: Error | undefined;
  #ended = false;

  /** `onLost` is told once when the connection fails or ends, unless {@link end} ended it. */
  constructor(
    config: pg.ClientConfig,
    private readonly onLost: (error: Error) => void,
  ) {
    this.#client = new pg.Client({
      ...config,
      stream: () => {
        this.#socket = new Socket();
        return this.#socket;
      },
    });
    this.#client.on('error', (error) => this.#lose(error));
    this.#client.on('end', () => this.#lose(new Error('the connection ended')));
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

  /**
   * Drops the connection at once for `reason`, without the goodbye
   * {@link end} waits for: on a half-open connection (the server or the
   * path to it gone without a word) nothing would ever answer it. What is
   * under way on it fails; `onLost` is told `reason`. The server frees what
   * the connection held when it notices (its keepalives), not before.
   */
  destroy(reason: Error): void {
    this.#lose(reason);
    this.#ended = true;
    this.#socket?.destroy();
  }

  #lose(error: Error): void {
    if (this.#lost !== undefined) return;
    this.#lost = error;
    if (!this.#ended) this.onLost(error);
  }
}
