import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

type Labels = 'method' | 'endpoint';

/**
 * The API client's Prometheus metrics. `endpoint` is the path template
 * (`/devices/{id}`), never a raw ID, so label cardinality stays fixed.
 */
export class EquinixApiMetrics {
  /** Latency of each attempt, labelled by its outcome: an HTTP status, `timeout` or `network_error`. */
  readonly requestDuration: Histogram<Labels | 'status'>;
  /** Attempts on the wire right now. */
  readonly requestsInFlight: Gauge<Labels>;
  /** Requests waiting for a concurrency slot or a rate-limit token. */
  readonly requestsWaiting: Gauge<Labels>;
  /** Retries, by why the previous attempt failed. */
  readonly retries: Counter<Labels | 'reason'>;

  constructor(registry: Registry) {
    // Several clients in one process may share a registry.
    const reuse = <M>(name: string, create: () => M): M =>
      (registry.getSingleMetric(name) as M | undefined) ?? create();
    this.requestDuration = reuse(
      'equinix_api_request_duration_seconds',
      () =>
        new Histogram({
          name: 'equinix_api_request_duration_seconds',
          help: 'Latency of Equinix Metal API requests (each attempt), by endpoint and status.',
          labelNames: ['method', 'endpoint', 'status'],
          buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
          registers: [registry],
        }),
    );
    this.requestsInFlight = reuse(
      'equinix_api_requests_in_flight',
      () =>
        new Gauge({
          name: 'equinix_api_requests_in_flight',
          help: 'Equinix Metal API requests on the wire.',
          labelNames: ['method', 'endpoint'],
          registers: [registry],
        }),
    );
    this.requestsWaiting = reuse(
      'equinix_api_requests_waiting',
      () =>
        new Gauge({
          name: 'equinix_api_requests_waiting',
          help: 'Equinix Metal API requests waiting for a concurrency slot or a rate-limit token.',
          labelNames: ['method', 'endpoint'],
          registers: [registry],
        }),
    );
    this.retries = reuse(
      'equinix_api_retries_total',
      () =>
        new Counter({
          name: 'equinix_api_retries_total',
          help: 'Equinix Metal API requests retried, by the failure that caused the retry.',
          labelNames: ['method', 'endpoint', 'reason'],
          registers: [registry],
        }),
    );
  }
}
