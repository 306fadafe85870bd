import pg from 'pg';

/** A BMDB connection's pools, each tuned for the statements it runs. */
export interface ConnectionPools {
  /** Everything but claims and heartbeats: transactions and reads, at the connection's isolation level. */
  readonly work: pg.Pool;
  /** The one-statement claims, ends and agent heartbeats, at READ COMMITTED, prepared and planned once. */
  readonly claims: pg.Pool;
  /** Session heartbeats alone, so they never queue behind work. */
  readonly heartbeats: pg.Pool;
  /** What every pool's connections share (server, credentials, TLS, name). */
  readonly base: pg.PoolConfig;
}

/** What {@link createPools} builds the pools from. */
export interface PoolSettings {
  readonly connectionString: string;
  /** At most 63 characters are kept (PostgreSQL's limit). */
  readonly applicationName: string;
  /** `pg`'s options for a server of one's own (TLS, credentials, timeouts); none for an embedded one. */
  readonly connection: pg.ClientConfig | undefined;
  /** The work pool's isolation level: `serializable`, `repeatable read` or `read committed`. */
  readonly isolation: string;
  /** Most connections of the work pool, and of the claim pool. */
  readonly poolSize: number;
  /** The session heartbeat interval in milliseconds: a heartbeat slower than that is too late anyway. */
  readonly interval: number;
}

/** A connection's pools, each set up for the statements it runs. */
export function createPools(settings: PoolSettings): ConnectionPools {
  const { connectionString, isolation, poolSize, interval } = settings;
  const base: pg.PoolConfig = {
    connectionString,
    application_name: settings.applicationName.slice(0, 63),
    ...settings.connection,
    keepAlive: true,
    // Every statement, including single ones outside BEGIN, runs at the
    // chosen level: ends are single statements. Sequential scans are
    // discouraged because at SERIALIZABLE one takes a predicate lock on the
    // whole table: on the small, hot `work` and `sessions` tables, every
    // finish would then conflict with every concurrent finish (PostgreSQL's
    // manual advises encouraging index scans for this). Large scans with no
    // usable index still run sequentially. Ends inline their values as
    // literals (sql/end-work.ts:endFinishedStatement), which standard_conforming_strings keeps literal.
    options: [
      `-c default_transaction_isolation=${isolation.replace(' ', '\\ ')}`,
      '-c enable_seqscan=off',
      '-c standard_conforming_strings=on',
    ].join(' '),
  };
  const work = new pg.Pool({ ...base, max: poolSize, connectionTimeoutMillis: 30_000 });
  // One-statement claims and ends are exclusive at READ COMMITTED by their
  // own locking (sql/claim.ts, sql/end-work.ts), and would only
  // conflict spuriously at SERIALIZABLE. A claim wants a few candidates from the front of an
  // index: nested loops of index lookups. Left to itself, the planner may
  // merge-join whole indexes (their key order matches) on the strength of
  // stale statistics. The statements are prepared, and planned once: left
  // to choose, PostgreSQL re-plans a claim for every execution once it
  // judges the generic plan costlier than custom ones, which it does after
  // statistics change, and planning one costs more than running it.
  const claims = new pg.Pool({
    ...base,
    options: [
      '-c default_transaction_isolation=read\\ committed',
      '-c enable_seqscan=off',
      '-c enable_mergejoin=off',
      '-c enable_hashjoin=off',
      '-c plan_cache_mode=force_generic_plan',
    ].join(' '),
    max: poolSize,
    connectionTimeoutMillis: 30_000,
  });
  // A heartbeat is a one-row update by primary key: READ COMMITTED makes it
  // exact, and unlike SERIALIZABLE it cannot fail for a serialization
  // conflict with the claims, finishes and collections around it (40001).
  const heartbeats = new pg.Pool({
    ...base,
    options: ['-c default_transaction_isolation=read\\ committed', '-c enable_seqscan=off'].join(' '),
    max: 2,
    connectionTimeoutMillis: interval,
    query_timeout: interval,
  });
  return { work, claims, heartbeats, base };
}
