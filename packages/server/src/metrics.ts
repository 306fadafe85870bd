import { Counter, Histogram, type Registry } from 'prom-client';

/**
 * The server's Prometheus metrics: heartbeats by gRPC status and their
 * latency. Batch sizes are the library's `bmdb_agent_heartbeat_batch_size`,
 * on the registry given to `BMDB.open`.
 */
export class ServerMetrics {
  readonly requests: Counter<'method' | 'code'>;
  readonly duration: Histogram<'method'>;

  constructor(registry: Registry) {
    this.requests = new Counter({
      name: 'bmaas_server_requests_total',
      help: 'AgentCallback requests answered, by method and gRPC status code name (ok, unauthenticated, …).',
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
  }
}
