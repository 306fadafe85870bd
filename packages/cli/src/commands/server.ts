import cluster from 'node:cluster';
import type { Server } from 'node:http';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { BmaasServer, ListenError, type ServerLimits } from '@bmaas/server';
import type { FleetPageServer } from '@bmaas/web';
import { AggregatorRegistry, collectDefaultMetrics, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { closeServer, readFleet, serveMetrics } from '../metrics-server.js';
import {
  type Argv,
  byteSize,
  databaseSettings,
  duration,
  hostPort,
  integer,
  metricsSettings,
  timerDuration,
  UsageError,
} from '../settings.js';
import { loadTls, type TlsSource, tlsFiles } from '../tls.js';
import { webSettings } from '../web-settings.js';
import { type FleetThresholds, onStopRequest, reportListening, superviseWorkers } from './server-workers.js';
import { prepareWeb, serveWeb } from './web.js';

/**
 * `shepherd server`: the BMaaS server agents heartbeat to, until
 * SIGINT/SIGTERM, then a clean stop (requests under way answered, the BMDB
 * closed). A second signal exits at once.
 *
 * With `--workers N` (N > 1) this process checks the flags, makes the
 * certificate, migrates the BMDB and serves the metrics, then forks N worker
 * processes (node:cluster) that share the listen socket, each taking whole
 * connections and batching its own heartbeats; it stops them all on a signal.
 */
export async function server(argv: Argv, write: (text: string) => void): Promise<void> {
  const database = databaseSettings(argv);
  const metrics = metricsSettings(argv);
  const listen = hostPort(argv, 'listen');
  if (listen === undefined) throw new UsageError('listen', 'required for server (or set SHEPHERD_LISTEN)');
  const source: TlsSource = tlsFiles(argv, { cert: 'tls-cert', key: 'tls-key' }, 'for a self-signed certificate') ?? {
    selfSignedDir: database.dataDir,
    name: 'server',
  };
  const workers = integer(argv, 'workers', 1, 64);
  const limits = serverLimits(argv);
  const worker = cluster.isWorker ? cluster.worker : undefined;
  // The fleet page, when asked for, is served by the primary alone.
  const webPage = webSettings(argv);
  const thresholds: FleetThresholds = {
    firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
    heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
  };
  const tls = await loadTls(source);
  const web = webPage && worker === undefined ? { page: await prepareWeb(webPage), thresholds } : undefined;
  if ('selfSignedDir' in source && worker === undefined) {
    write(
      `${tls.created ? 'generated a' : 'using the'} self-signed server certificate ${tls.certPath}: hand it to agents with \`shepherd run … --agent-endpoint-ca-certificate-path ${tls.certPath}\`\n`,
    );
  }

  if (workers > 1 && worker === undefined) {
    return superviseWorkers({
      workers,
      database,
      listen,
      thresholds,
      ...(metrics && { metrics }),
      ...(web && { web }),
    });
  }

  const registry = new Registry();
  if (worker !== undefined) {
    // The primary serves the metrics of all workers, each series labelled with its worker.
    registry.setDefaultLabels({ worker: String(worker.id) });
    AggregatorRegistry.setRegistries([registry]);
    new AggregatorRegistry();
  }
  collectDefaultMetrics({ register: registry });
  let metricsServer: Server | undefined;
  let bmaas: BmaasServer | undefined;
  let bmdb: BMDB | undefined;
  let webServer: FleetPageServer | undefined;
  const stopped = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopped.signal.aborted) {
      log('second %s: exiting at once', signal);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    log('%s: stopping cleanly (requests under way are answered); send it again to exit at once', signal);
    stopped.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const offStopRequest = onStopRequest(() => {
    if (stopped.signal.aborted) return;
    log('the primary asks to stop: stopping cleanly (requests under way are answered)');
    stopped.abort();
  });
  try {
    if (metrics && worker === undefined) metricsServer = await serveMetrics(registry, metrics.listen);
    // Workers find the BMDB migrated, and the embedded server (if any) run, by the primary.
    bmdb = await openBMDB(database, { migrate: worker === undefined, metrics: registry, attach: true });
    if (metrics && worker === undefined) readFleet(bmdb, registry, metrics, thresholds);
    try {
      bmaas = await BmaasServer.start({ bmdb, listen, tls, metrics: registry, limits });
    } catch (error) {
      if (error instanceof ListenError) throw new UsageError('listen', error.message);
      throw error;
    }
    if (web) webServer = await serveWeb(bmdb, web.page, web.thresholds);
    if (worker === undefined) log('BMaaS server listening on %s:%d', listen.host, bmaas.port);
    else reportListening(bmaas.port);
    if (!stopped.signal.aborted) {
      await new Promise((resolve) => stopped.signal.addEventListener('abort', resolve, { once: true }));
    }
    log('stopped');
  } finally {
    await bmaas?.close();
    await webServer?.close();
    await bmdb?.close();
    if (metricsServer) await closeServer(metricsServer);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    offStopRequest();
  }
}

/**
 * What a client may hold of the server, from its flags: connections,
 * streams per connection, bytes of requests not yet answered per
 * connection and in all (a connection's share at most the whole), the time
 * a request may take, a connection's idle time.
 */
function serverLimits(argv: Argv): ServerLimits {
  const bufferedBytes = byteSize(argv, 'max-buffered-bytes', 1024);
  const bufferedBytesPerConnection = byteSize(argv, 'max-buffered-bytes-per-connection', 1024);
  if (bufferedBytesPerConnection > bufferedBytes) {
    throw new UsageError(
      'max-buffered-bytes-per-connection',
      `${argv['max-buffered-bytes-per-connection']} is more than --max-buffered-bytes (${argv['max-buffered-bytes']})`,
    );
  }
  return {
    connections: integer(argv, 'max-connections', 1, 10_000_000),
    streamsPerConnection: integer(argv, 'max-streams-per-connection', 1, 2 ** 32 - 1),
    bufferedBytesPerConnection,
    bufferedBytes,
    requestTimeout: timerDuration(argv, 'request-timeout'),
    idleTimeout: timerDuration(argv, 'idle-timeout'),
  };
}
