import cluster from 'node:cluster';
import type { Server } from 'node:http';
import path from 'node:path';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import {
  BmaasServer,
  ListenError,
  loadServerTls,
  type ServerTls,
  ServerTlsError,
  selfSignedServerTls,
} from '@bmaas/server';
import type { FleetPageServer } from '@bmaas/web';
import { AggregatorRegistry, collectDefaultMetrics, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { closeServer, serveMetrics } from '../metrics-server.js';
import {
  type Argv,
  databaseSettings,
  duration,
  hostPort,
  integer,
  optional,
  UsageError,
  webSettings,
} from '../settings.js';
import { type FleetThresholds, onStopRequest, reportListening, superviseWorkers } from './server-workers.js';
import { serveWeb } from './web.js';

/** Where the server's certificate comes from: files given, or one made under the data directory. */
type TlsSource = { readonly certPath: string; readonly keyPath: string } | { readonly selfSignedDir: string };

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
  const metricsListen = hostPort(argv, 'metrics-listen');
  const listen = hostPort(argv, 'listen');
  if (listen === undefined) throw new UsageError('listen', 'required for server (or set SHEPHERD_LISTEN)');
  const certPath = optional(argv, 'tls-cert');
  const keyPath = optional(argv, 'tls-key');
  if ((certPath === undefined) !== (keyPath === undefined)) {
    const [given, missing] = certPath === undefined ? ['tls-key', 'tls-cert'] : ['tls-cert', 'tls-key'];
    throw new UsageError(missing, `required with --${given} (or leave both unset for a self-signed certificate)`);
  }
  const source: TlsSource =
    certPath !== undefined && keyPath !== undefined
      ? { certPath: path.resolve(certPath), keyPath: path.resolve(keyPath) }
      : { selfSignedDir: database.dataDir };
  const workers = integer(argv, 'workers', 1, 64);
  const worker = cluster.isWorker ? cluster.worker : undefined;
  // The fleet page, when asked for, is served by the primary alone.
  const webPage = webSettings(argv);
  const thresholds: FleetThresholds = {
    firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
    heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
  };
  const web = webPage && worker === undefined ? { settings: webPage, thresholds } : undefined;
  const tls = await serverTls(source);
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
      ...(metricsListen && { metricsListen }),
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
    if (metricsListen && worker === undefined) metricsServer = await serveMetrics(registry, metricsListen);
    // Workers find the BMDB migrated, and the embedded server (if any) run, by the primary.
    bmdb = await openBMDB(database, { migrate: worker === undefined, metrics: registry, attach: true });
    try {
      bmaas = await BmaasServer.start({ bmdb, listen, tls, metrics: registry });
    } catch (error) {
      if (error instanceof ListenError) throw new UsageError('listen', error.message);
      throw error;
    }
    if (web) webServer = await serveWeb(bmdb, web.settings, web.thresholds);
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

/** The certificate and key, bad files reported as bad input naming their flag. */
async function serverTls(source: TlsSource): Promise<ServerTls & { readonly created: boolean }> {
  try {
    if ('selfSignedDir' in source) return await selfSignedServerTls(source.selfSignedDir);
    return { ...(await loadServerTls(source.certPath, source.keyPath)), created: false };
  } catch (error) {
    if (!(error instanceof ServerTlsError)) throw error;
    if ('selfSignedDir' in source) throw new UsageError('data-dir', error.message);
    throw new UsageError(error.file === source.keyPath ? 'tls-key' : 'tls-cert', error.message);
  }
}
