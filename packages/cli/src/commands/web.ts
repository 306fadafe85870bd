import type { BMDB } from '@bmaas/bmdb-controlloop';
import { attachFleetPage, type FleetPageServer, WebListenError } from '@bmaas/web';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { type Argv, databaseSettings, duration, UsageError, type WebSettings, webSettings } from '../settings.js';

/** Where `shepherd web` listens unless told otherwise. */
export const DEFAULT_WEB_LISTEN = { host: '127.0.0.1', port: 8080 } as const;

/**
 * Serves the fleet page of an open BMDB until closed; a port that cannot be
 * listened on is bad input naming `--web-listen`.
 */
export async function serveWeb(
  bmdb: BMDB,
  settings: WebSettings,
  thresholds: { firstHeartbeatWithin: number; heartbeatWithin: number },
): Promise<FleetPageServer> {
  try {
    const server = await attachFleetPage(bmdb, {
      listen: settings.listen,
      token: settings.token,
      thresholds,
      onError: (error, path) => log('fleet page: %s failed: %s', path, error instanceof Error ? error.message : error),
    });
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
  const thresholds = {
    firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
    heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
  };
  const bmdb = await openBMDB(database, { migrate: false, readOnly: true, attach: true });
  let server: FleetPageServer | undefined;
  const stopped = new Promise<NodeJS.Signals>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  try {
    server = await serveWeb(bmdb, settings, thresholds);
    write(`fleet page at ${server.url}\n`);
    const signal = await stopped;
    log('%s: stopping', signal);
  } finally {
    await server?.close();
    await bmdb.close();
  }
}
