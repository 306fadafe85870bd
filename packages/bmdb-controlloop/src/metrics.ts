import { Counter, type Registry } from 'prom-client';
import type { WorkOutcome } from './errors.js';

type Labels<K extends string> = Record<K, string>;

/**
 * The BMDB's Prometheus metrics, registered on the registry given to
 * `BMDB.open`. Counters are labelled by `processor` (the component role a
 * session was started for) and, for work, by `process`.
 */
export class BMDBMetrics {
  readonly sessionsStarted: Counter<'processor'>;
  readonly transactionsExecuted: Counter<'processor'>;
  readonly transactionsRetried: Counter<'processor'>;
  readonly transactionsFailed: Counter<'processor'>;
  /** Statements and heartbeats failed by a failover or outage, by its `ConnectionLoss` (internal/connection-lost.ts). */
  readonly connectionLost: Counter<'processor' | 'cause'>;
  readonly workStarted: Counter<'processor' | 'process'>;
  readonly workFinished: Counter<'processor' | 'process' | 'result'>;
  readonly heartbeats: Counter<'processor'>;
  readonly heartbeatsFailed: Counter<'processor' | 'code'>;

  constructor(registry: Registry) {
    const counter = <K extends string>(name: string, help: string, labelNames: readonly K[]): Counter<K> => {
      // Several BMDB connections in one process may share a registry.
      const existing = registry.getSingleMetric(name);
      if (existing) return existing as Counter<K>;
      return new Counter<K>({ name, help, labelNames, registers: [registry] });
    };
    this.sessionsStarted = counter('bmdb_session_started_total', 'BMDB sessions started.', ['processor']);
    this.transactionsExecuted = counter(
      'bmdb_transaction_executed_total',
      'BMDB transactions attempted (each retry counts once more).',
      ['processor'],
    );
    this.transactionsRetried = counter(
      'bmdb_transaction_retried_total',
      'BMDB transactions retried after a serialization failure, a deadlock, or a failover error after which nothing ran (a read-only node, a server starting up).',
      ['processor'],
    );
    this.transactionsFailed = counter('bmdb_transaction_failed_total', 'BMDB transactions that failed for good.', [
      'processor',
    ]);
    this.connectionLost = counter(
      'bmdb_connection_lost_total',
      'BMDB statements and session heartbeats that failed because the connection was lost or reached a node that ' +
        'is not a writable primary (a failover or an outage), by cause: connection_lost, admin_shutdown, ' +
        'starting_up, read_only, too_many_connections.',
      ['processor', 'cause'],
    );
    this.workStarted = counter('bmdb_work_started_total', 'Work items claimed.', ['processor', 'process']);
    this.workFinished = counter('bmdb_work_finished_total', 'Work items ended, by result.', [
      'processor',
      'process',
      'result',
    ]);
    this.heartbeats = counter(
      'bmdb_session_heartbeat_total',
      'Session heartbeats sent (each retry counts once more).',
      ['processor'],
    );
    this.heartbeatsFailed = counter(
      'bmdb_session_heartbeat_failed_total',
      'Session heartbeats that failed (and were retried), by SQLSTATE (`none` for a lost connection or timeout).',
      ['processor', 'code'],
    );
  }

  /** @internal */
  workEnded(labels: Labels<'processor' | 'process'>, result: WorkOutcome): void {
    this.workFinished.inc({ ...labels, result });
  }
}
