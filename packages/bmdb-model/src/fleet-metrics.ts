import { type BMDB, BMDBError, runRounds } from '@bmaas/bmdb-controlloop';
import { extensionOf } from '@bmaas/bmdb-controlloop/extend';
import { describeError } from '@bmaas/common';
import createDebug from 'debug';
import { Kysely, PostgresDialect, sql } from 'kysely';
import type pg from 'pg';
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { type FleetGauge, FleetGaugeSet, type FleetReading, type FleetSample } from './fleet-gauges.js';
import { SingleConnection } from './internal/single-connection.js';
import type { RecoveryThresholds } from './queries/recovery-thresholds.js';
import type { Database } from './schema.js';

/** Options of {@link startFleetMetrics}. */
export interface FleetMetricsOptions {
  /** Where the fleet's gauges and the reader's own metrics are registered. */
  readonly registry: Registry;
  /** Milliseconds between readings (and between attempts to become the reader). Default 30 s, at least 1 s. */
  readonly interval?: number;
  /** When a started agent counts as lost (awaiting recovery): give the recoverer's. */
  readonly thresholds?: RecoveryThresholds;
}

/**
 * The advisory lock the fleet's reader holds, in the BMDB's database: the
 * ASCII of `bmdb_flt`. Kysely's migration lock is another key.
 */
export const FLEET_READER_LOCK = 0x626d64625f666c74n;

const DEFAULT_INTERVAL = 30_000;

/** The reader's own metrics, exported by every process that runs one. */
class ReaderMetrics {
  readonly up: Gauge;
  readonly leading: Gauge;
  readonly duration: Histogram;
  readonly failed: Counter;

  constructor(registry: Registry) {
    this.up = new Gauge({
      name: 'bmdb_up',
      help: 'Whether this process reached the BMDB at its last fleet reading or attempt to become the reader (1) or not (0).',
      registers: [registry],
    });
    this.leading = new Gauge({
      name: 'bmdb_fleet_reader_leading',
      help: 'Whether this process is the one reading the fleet gauges (1: it holds the reader lock) or not (0).',
      registers: [registry],
    });
    this.duration = new Histogram({
      name: 'bmdb_fleet_reading_duration_seconds',
      help: 'Time of one reading of the fleet gauges (every query, one transaction), in the process reading them.',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
      registers: [registry],
    });
    this.failed = new Counter({
      name: 'bmdb_fleet_reading_failed_total',
      help: 'Readings of the fleet gauges (or attempts to become the reader) that failed; the gauges are cleared until one succeeds.',
      registers: [registry],
    });
  }
}

/** Who reads the fleet's gauges, and readings failing; enable with `DEBUG=bmdb:fleet`. */
const fleetLog = createDebug('bmdb:fleet');

/**
 * Starts reading the fleet's gauges (machines per stage, provider and
 * location; backoffs and work per process; live sessions; the newest agent
 * heartbeat's age; hardware totals) into `options.registry` every
 * interval, on a connection of its own, until closed (or `bmdb` is).
 * Of all the processes that do so on one BMDB, one at a time reads (it
 * holds an advisory lock); the others export only `bmdb_up` and
 * `bmdb_fleet_reader_leading` and take over when it stops. See
 * {@link FleetMetrics}.
 *
 * @throws {@link BMDBError} for an interval under 1 s, or a registry that
 *   already has the fleet's gauges; `ConnectionClosedError` once `bmdb` is
 *   closed
 */
export function startFleetMetrics(bmdb: BMDB, options: FleetMetricsOptions): FleetMetrics {
  const connection = extensionOf(bmdb);
  connection.assertOpen();
  let forget = (): unknown => undefined;
  const reader: FleetMetrics = new FleetMetrics(connection.connectionConfig, options, () => forget());
  forget = connection.closeWith(() => reader.close());
  return reader;
}

/**
 * The fleet's gauges ({@link FLEET_GAUGES}), read from the BMDB every
 * interval by one process at a time. Started by {@link startFleetMetrics}.
 *
 * Every process that serves metrics may run one; they share the work through
 * a PostgreSQL advisory lock ({@link FLEET_READER_LOCK}), held on a
 * connection of the reader's own: its holder reads and exports the gauges,
 * the others try for the lock at each interval and export none, so the fleet
 * is read once per interval whatever the number of processes, and each
 * series comes from one of them (queries `max without (instance)` across a
 * hand-over). When the holder stops or dies its connection closes and the
 * lock is free; the next attempt of another process takes it. A reading that
 * fails, or has not finished within its interval, ends the connection (and
 * the lock): the gauges are cleared and `bmdb_up` is 0 at once, never left
 * stale, even on a connection gone half-open that nothing answers.
 *
 * Each reading is one REPEATABLE READ, READ ONLY transaction: one snapshot,
 * no predicate locks on the shepherds' tables, nothing written (the page's
 * read-only `shepherd web` may read too).
 */
export class FleetMetrics {
  readonly #gauges: FleetGaugeSet;
  readonly #metrics: ReaderMetrics;
  readonly #stop = new AbortController();
  readonly #loop: Promise<void>;
  #connection: SingleConnection | undefined;
  #db: Kysely<Database> | undefined;
  #leading = false;
  #failing = false;

  /** @internal Use {@link startFleetMetrics}. */
  constructor(
    private readonly connection: pg.ClientConfig,
    private readonly options: FleetMetricsOptions,
    private readonly onClosed: () => void,
  ) {
    const interval = options.interval ?? DEFAULT_INTERVAL;
    if (!Number.isFinite(interval) || interval < 1000) {
      throw new BMDBError(`fleet metrics: interval must be at least 1s, got ${interval}ms`);
    }
    this.#gauges = new FleetGaugeSet(options.registry);
    this.#metrics = new ReaderMetrics(options.registry);
    this.#metrics.leading.set(0);
    this.#loop = this.#run(interval);
  }

  /** Whether this process reads the fleet now (holds the reader lock). */
  get leading(): boolean {
    return this.#leading;
  }

  /** Stops reading, releases the lock and removes the fleet's gauges. */
  async close(): Promise<void> {
    this.#stop.abort();
    await this.#loop;
    this.onClosed();
  }

  async #run(interval: number): Promise<void> {
    // One attempt every interval (the rules of runRounds); #tick reports and recovers from its own failures.
    await runRounds(
      {
        signal: this.#stop.signal,
        interval,
        onFailure: (error) => fleetLog('reading the fleet metrics failed: %s', describeError(error)),
      },
      () => this.#tick(interval),
    );
    this.#gauges.clear();
    this.#setLeading(false);
    await this.#disconnect();
  }

  /**
   * One attempt, given up once it has taken `interval` (or the reader
   * stops): a reading slower than its interval is of no use, and one that
   * hangs is a connection gone half-open (the BMDB's host or the path to it
   * gone without a word), on which nothing would answer until TCP gives up,
   * a quarter of an hour later. Meanwhile the BMDB may end the backend,
   * free the lock, and another process read: this one drops the connection
   * and clears its gauges, as for any failed reading.
   */
  async #tick(interval: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    let onStop: (() => void) | undefined;
    const givenUp = new Promise<never>((_, reject) => {
      const giveUp = (error: Error) => {
        this.#connection?.destroy(error);
        reject(error);
      };
      timer = setTimeout(
        () => giveUp(new BMDBError(`fleet metrics: no reading within ${interval / 1000}s: dropped its connection`)),
        interval,
      );
      onStop = () => giveUp(new BMDBError('fleet metrics: stopped'));
      this.#stop.signal.addEventListener('abort', onStop, { once: true });
    });
    const attempt = this.#attempt(interval);
    // Once given up, the attempt fails with its connection; nothing waits for it.
    attempt.catch(() => {});
    try {
      await Promise.race([attempt, givenUp]);
      this.#metrics.up.set(1);
      if (this.#failing) fleetLog('the BMDB answers again');
      this.#failing = false;
    } catch (error) {
      if (this.#stop.signal.aborted) return;
      this.#metrics.up.set(0);
      this.#metrics.failed.inc();
      this.#gauges.clear();
      if (!this.#failing) {
        fleetLog(
          'reading the fleet metrics failed (retried every %ds; the gauges are cleared meanwhile): %s',
          interval / 1000,
          describeError(error),
        );
      }
      this.#failing = true;
      this.#setLeading(false);
      await this.#disconnect();
    } finally {
      clearTimeout(timer);
      if (onStop) this.#stop.signal.removeEventListener('abort', onStop);
    }
  }

  /** Becomes the reader if no one is, and reads if this process is. */
  async #attempt(interval: number): Promise<void> {
    const db = await this.#connect(interval);
    if (!this.#leading) {
      const { rows } = await sql<{ locked: boolean }>`
        SELECT pg_try_advisory_lock(${FLEET_READER_LOCK}) AS locked`.execute(db);
      this.#setLeading(rows[0]?.locked === true);
    }
    if (this.#leading) {
      const started = performance.now();
      const samples = await readFleet(db, this.#gauges, this.options.thresholds ?? {});
      // The lock lives with the connection: had it dropped, another process may read now.
      if (this.#connection?.lost) throw this.#connection.lost;
      this.#gauges.set(samples);
      this.#metrics.duration.observe((performance.now() - started) / 1000);
    }
  }

  async #connect(interval: number): Promise<Kysely<Database>> {
    if (this.#db && this.#connection && !this.#connection.lost) return this.#db;
    await this.#disconnect();
    const connection = new SingleConnection(readerConnection(this.connection, interval), (error) =>
      this.#connectionLost(error),
    );
    this.#connection = connection;
    await connection.open();
    this.#db = new Kysely<Database>({ dialect: new PostgresDialect({ pool: connection }) });
    return this.#db;
  }

  async #disconnect(): Promise<void> {
    const connection = this.#connection;
    this.#connection = undefined;
    this.#db = undefined;
    await connection?.end();
  }

  /** The lock went with the connection: another process may read now, so this one's gauges go at once. */
  #connectionLost(error: Error): void {
    if (this.#stop.signal.aborted) return;
    this.#metrics.up.set(0);
    this.#gauges.clear();
    if (this.#leading) fleetLog('lost the connection holding the reader lock: %s', describeError(error));
    this.#setLeading(false);
  }

  #setLeading(leading: boolean): void {
    if (leading !== this.#leading) {
      fleetLog(
        leading
          ? 'this process reads the fleet metrics now (it holds the reader lock)'
          : 'this process no longer reads the fleet metrics',
      );
    }
    this.#leading = leading;
    this.#metrics.leading.set(leading ? 1 : 0);
  }
}

/**
 * @internal The reader's connection: `base` (the BMDB's server, credentials,
 * TLS, name) with its own settings.
 */
export function readerConnection(base: pg.ClientConfig, interval: number): pg.ClientConfig {
  return {
    ...base,
    // A reading slower than its interval is of no use; the server notices a
    // vanished reader within ~25 s (keepalives) and frees its lock. Indexes
    // only, as the library's pools, and no parallel workers: a background
    // reading of small sets gains nothing from them and would take cores
    // from the shepherds' statements.
    statement_timeout: interval,
    options: [
      '-c enable_seqscan=off',
      '-c max_parallel_workers_per_gather=0',
      '-c tcp_keepalives_idle=10',
      '-c tcp_keepalives_interval=5',
      '-c tcp_keepalives_count=3',
    ].join(' '),
  };
}

/**
 * @internal One reading of every gauge in one REPEATABLE READ, READ ONLY
 * transaction: one snapshot, nothing written, no predicate locks.
 */
export function readFleet(
  db: Kysely<Database>,
  gauges: FleetGaugeSet,
  thresholds: RecoveryThresholds,
): Promise<Map<FleetGauge, readonly FleetSample<string>[]>> {
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .setAccessMode('read only')
    .execute((trx) => gauges.read(reading(trx, thresholds)));
}

/** A reading's context: its queries, thresholds, and answers shared between gauges. */
function reading(q: Kysely<Database>, thresholds: RecoveryThresholds): FleetReading {
  const answers = new Map<string, Promise<unknown>>();
  return {
    q,
    thresholds,
    once<T>(key: string, read: () => Promise<T>): Promise<T> {
      let answer = answers.get(key) as Promise<T> | undefined;
      if (answer === undefined) {
        answer = read();
        answers.set(key, answer);
      }
      return answer;
    },
  };
}
