import type { Server } from 'node:http';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import type { ServerTls } from '@bmaas/server';
import { attachFleetPage, type FleetPageServer, WebListenError } from '@bmaas/web';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { closeServer, readFleet, serveMetrics } from '../metrics-server.js';
import { type Argv, databaseSettings, duration, metricsSettings, UsageError } from '../settings.js';
import { loadTls } from '../tls.js';
import { type WebSettings, webSettings } from '../web-settings.js';

/** Where `shepherd web` listens unless told otherwise. */
export const DEFAULT_WEB_LISTEN = { host: '127.0.0.1', port: 8080 } as const;

/** The fleet page's settings, its certificate loaded (or made): what {@link serveWeb} serves. */
export interface FleetPage {
  readonly settings: WebSettings;
  readonly tls: (ServerTls & { readonly created: boolean }) | undefined;
}

/**
 * Loads or makes the page's certificate, before anything else is touched: a
 * bad file is bad input naming its flag.
 */
export async function prepareWeb(settings: WebSettings): Promise<FleetPage> {
  return { settings, tls: settings.tls && (await loadTls(settings.tls)) };
}

/**
 * Serves the fleet page of an open BMDB until closed; a port that cannot be
 * listened on is bad input naming `--web-listen`.
 */
export async function serveWeb(
  bmdb: BMDB,
  page: FleetPage,
  thresholds: { firstHeartbeatWithin: number; heartbeatWithin: number },
): Promise<FleetPageServer> {
  const { settings, tls } = page;
  try {
    const server = await attachFleetPage(bmdb, {
      listen: settings.listen,
      token: settings.token,
      tls: tls && { cert: tls.cert, key: tls.key },
      insecureHttp: settings.insecureHttp,
      thresholds,
      onError: (error, path) => log('fleet page: %s failed: %s', path, error instanceof Error ? error.message : error),
    });
    if (tls?.created) {
      log(
        'made a self-signed certificate for the fleet page, %s: trust it in the browsers that open the page',
        tls.certPath,
      );
    }
    if (settings.insecureHttp) {
      log(
        'serving the fleet page as plain HTTP (--web-insecure-http): only a TLS-terminating proxy in front may reach it; browsers must come over HTTPS (its cookies are Secure)',
      );
    }
    log('serving the fleet page at %s%s', server.url, settings.token === undefined ? '' : ' (token required)');
    return server;
  } catch (error) {
    if (error instanceof WebListenError) throw new UsageError('web-listen', error.message);
    throw error;
  }
}

/**
 * `shepherd web`: the read-only fleet page in a process of its own, until
 * SIGINT/SIGTERM. Opens the BMDB without migrating and never writes to it.
 */
export async function web(argv: Argv, write: (text: string) => void): Promise<void> {
  const database = databaseSettings(argv);
  const settings = webSettings(argv, DEFAULT_WEB_LISTEN) as WebSettings;
  const metrics = metricsSettings(argv);
  const page = await prepareWeb(settings);
  const thresholds = {
    firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
    heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
  };
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  let metricsServer: Server | undefined;
  let bmdb: BMDB | undefined;
  let server: FleetPageServer | undefined;
  const stopped = new Promise<NodeJS.Signals>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  try {
    if (metrics) metricsServer = await serveMetrics(registry, metrics.listen);
    bmdb = await openBMDB(database, { migrate: false, readOnly: true, attach: true });
    // Reading the fleet writes nothing: the page's process may be its reader.
    if (metrics) readFleet(bmdb, registry, metrics, thresholds);
    server = await serveWeb(bmdb, page, thresholds);
    write(`fleet page at ${server.url}\n`);
    const signal = await stopped;
    log('%s: stopping', signal);
  } finally {
    await server?.close();
    await bmdb?.close();
    if (metricsServer) await closeServer(metricsServer);
  }
}
