import { createServer, type Server } from 'node:http';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import type { FleetMetrics, RecoveryThresholds } from '@bmaas/bmdb-model';
import { startFleetMetrics } from '@bmaas/bmdb-model';
import type { Registry } from 'prom-client';
import { log } from './logging.js';
import { type MetricsSettings, UsageError } from './settings.js';

/** An HTTP server answering `GET /metrics` with the registry in Prometheus text format. */
export async function serveMetrics(
  registry: { readonly contentType: string; metrics(): Promise<string> },
  listen: { host: string; port: number },
): Promise<Server> {
  const server = createServer((request, response) => {
    if (request.method !== 'GET' || request.url?.split('?')[0] !== '/metrics') {
      response.writeHead(404, { 'content-type': 'text/plain' }).end('not found: metrics are at /metrics\n');
      return;
    }
    registry.metrics().then(
      (text) => response.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (error: unknown) => response.writeHead(500).end(`${(error as Error).message}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) =>
      reject(
        new UsageError(
          'metrics-listen',
          `cannot listen on ${listen.host}:${listen.port} (${error.code ?? error.message})`,
        ),
      ),
    );
    server.listen(listen.port, listen.host, resolve);
  });
  log('serving metrics at http://%s:%d/metrics', listen.host, listen.port);
  return server;
}

export function closeServer(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}

/**
 * Offers this process as the reader of the fleet gauges, on `registry`: of
 * the processes serving metrics on one BMDB, one at a time reads them (see
 * `FleetMetrics`). `thresholds` are the recoverer's, which decide who is
 * awaiting recovery. Closed with the BMDB.
 */
export function readFleet(
  bmdb: BMDB,
  registry: Registry,
  settings: MetricsSettings,
  thresholds: RecoveryThresholds,
): FleetMetrics {
  return startFleetMetrics(bmdb, { registry, interval: settings.fleetInterval, thresholds });
}
