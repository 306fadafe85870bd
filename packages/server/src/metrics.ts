import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { RequestBudget } from './limits.js';

/**
 * The server's Prometheus metrics: heartbeats and enrollments by gRPC status
 * and their latency, enrollments by result; the bytes of requests not yet answered it holds, the requests
 * it cut off for a limit and the connections it refused (`limits.ts`). Batch sizes are the library's `bmdb_agent_heartbeat_batch_size`,
 * on the registry given to `BMDB.open`.
 */
export class ServerMetrics {
  readonly requests: Counter<'method' | 'code'>;
  readonly duration: Histogram<'method'>;
  readonly buffered: Gauge;
  /** What `buffered` reads: the server's request budget, once it has one. */
  #budget: RequestBudget | undefined;
  readonly cutOff: Counter<'limit'>;
  readonly enrollments: Counter<'result'>;
  readonly connectionsRefused: Counter;

  constructor(registry: Registry) {
    this.requests = new Counter({
      name: 'bmaas_server_requests_total',
      help: 'Agent requests answered (Heartbeat, Enroll), by method and gRPC status code name (ok, unauthenticated, …).',
      labelNames: ['method', 'code'],
      registers: [registry],
    });
    this.duration = new Histogram({
      name: 'bmaas_server_request_duration_seconds',
      help: 'Time from a request’s arrival to its answer, by method.',
      labelNames: ['method'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: [registry],
    });
    this.buffered = new Gauge({
      // Read when scraped, not set per chunk of a body: a heartbeat's request would set it twice.
      collect: () => this.buffered.set(this.#budget?.buffered ?? 0),
      name: 'bmaas_server_buffered_request_bytes',
      help: 'Bytes of requests not yet answered the server holds, of every connection.',
      registers: [registry],
    });
    this.cutOff = new Counter({
      name: 'bmaas_server_requests_cut_off_total',
      help: 'Requests cut off before they were answered, by the limit they passed (bufferedBytesPerConnection, bufferedBytes, requestTimeout).',
      labelNames: ['limit'],
      registers: [registry],
    });
    this.connectionsRefused = new Counter({
      name: 'bmaas_server_connections_refused_total',
      help: 'Connections closed as they were accepted: the server had its connections limit open.',
      registers: [registry],
    });
    this.enrollments = new Counter({
      name: 'bmaas_server_enrollments_total',
      help: 'Agent enrollments, by result: Enrolled, Repeated (its token presented again with the key it enrolled), or why one was refused (NoToken, WrongToken, Expired, Used).',
      labelNames: ['result'],
      registers: [registry],
    });
  }

  /** `bmaas_server_buffered_request_bytes` is what `budget` holds, read when scraped. */
  readBufferedFrom(budget: RequestBudget): void {
    this.#budget = budget;
  }
}
