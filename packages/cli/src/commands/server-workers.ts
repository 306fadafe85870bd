import cluster, { type Worker } from 'node:cluster';
import type { Server } from 'node:http';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import type { FleetPageServer } from '@bmaas/web';
import { AggregatorRegistry, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { closeServer, readFleet, serveMetrics } from '../metrics-server.js';
import type { DatabaseSettings, MetricsSettings } from '../settings.js';
import { type FleetPage, serveWeb } from './web.js';

/** What a worker tells the primary once it listens. */
interface ListeningMessage {
  readonly type: 'shepherd:server-listening';
  readonly port: number;
}

/** What the primary tells a worker when it is to stop. */
interface StopMessage {
  readonly type: 'shepherd:server-stop';
}

function isListening(message: unknown): message is ListeningMessage {
  return (message as { type?: unknown } | null)?.type === 'shepherd:server-listening';
}

function isStop(message: unknown): message is StopMessage {
  return (message as { type?: unknown } | null)?.type === 'shepherd:server-stop';
}

/** In a worker: tells the primary it listens on `port`. */
export function reportListening(port: number): void {
  process.send?.({ type: 'shepherd:server-listening', port } satisfies ListeningMessage);
}

/**
 * In a worker: calls `stop` when the primary asks it to stop (a message, not
 * a signal, so that a Ctrl-C the terminal also sent to the worker does not
 * count twice and end it at once). Returns the unsubscribe.
 */
export function onStopRequest(stop: () => void): () => void {
  const listener = (message: unknown) => {
    if (isStop(message)) stop();
  };
  process.on('message', listener);
  return () => process.off('message', listener);
}

/** A worker ended on its own: the server is no longer what was asked for. */
export class ServerWorkerExitedError extends Error {
  override name = 'ServerWorkerExitedError';
  constructor(
    readonly workerId: number,
    readonly pid: number | undefined,
    readonly exitCode: number | null,
    readonly signal: string | null,
  ) {
    super(
      `server worker ${workerId} (pid ${pid ?? '?'}) exited ${signal ? `on ${signal}` : `with status ${exitCode}`}; stopped the others`,
    );
  }
}

export interface WorkerOptions {
  readonly workers: number;
  readonly database: DatabaseSettings;
  readonly listen: { readonly host: string; readonly port: number };
  /** The workers' metrics, aggregated, and the fleet gauges when the primary reads them. */
  readonly metrics?: MetricsSettings;
  /** The recoverer's, for the fleet gauges and page. */
  readonly thresholds: FleetThresholds;
  /** The fleet page, served by the primary alone (it has its own port). */
  readonly web?: { readonly page: FleetPage; readonly thresholds: FleetThresholds };
}

/** The recoverer's heartbeat timeouts, which decide who is awaiting recovery on the fleet page. */
export interface FleetThresholds {
  readonly firstHeartbeatWithin: number;
  readonly heartbeatWithin: number;
}

/**
 * The primary of `shepherd server --workers N`: migrates the BMDB (and keeps
 * an embedded server, if any, running for the workers to attach to), serves
 * the workers' metrics aggregated, forks the workers (the same command line;
 * node:cluster hands each new connection to one of them in turn), and on
 * SIGINT/SIGTERM asks each to stop cleanly and waits for all. A second
 * signal kills them at once. If one worker ends on its own, the others are
 * stopped and the command fails.
 */
export async function superviseWorkers(options: WorkerOptions): Promise<void> {
  let bmdb: BMDB | undefined;
  let metricsServer: Server | undefined;
  let webServer: FleetPageServer | undefined;
  const live = new Set<Worker>();
  let stopping = false;
  let failure: ServerWorkerExitedError | undefined;
  let wake: () => void = () => {};
  const woken = new Promise<void>((resolve) => {
    wake = resolve;
  });

  const stopAll = () => {
    stopping = true;
    for (const worker of live) {
      if (worker.isConnected()) worker.send({ type: 'shepherd:server-stop' } satisfies StopMessage);
      else worker.process.kill('SIGTERM');
    }
    wake();
  };
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) {
      log('second %s: killing the server workers and exiting at once', signal);
      for (const worker of live) worker.process.kill('SIGKILL');
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    log(
      '%s: stopping the server workers cleanly (requests under way are answered); send it again to exit at once',
      signal,
    );
    stopAll();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    // The primary's own metrics (the fleet gauges, if it reads them) after the workers'.
    const own = new Registry();
    if (options.metrics) {
      const aggregator = new AggregatorRegistry();
      metricsServer = await serveMetrics(
        {
          contentType: aggregator.contentType,
          metrics: async () => `${await aggregator.clusterMetrics()}\n${await own.metrics()}`,
        },
        options.metrics.listen,
      );
    }
    bmdb = await openBMDB(options.database, { migrate: true, attach: true });
    if (options.metrics) readFleet(bmdb, own, options.metrics, options.thresholds);
    if (options.web) webServer = await serveWeb(bmdb, options.web.page, options.web.thresholds);

    const exited = resolvers<void>();
    const listening = new Map<Worker, number>();
    const allListening = resolvers<number>();
    for (let i = 0; i < options.workers; i++) {
      const worker = cluster.fork();
      live.add(worker);
      log('server worker %d (pid %d) started', worker.id, worker.process.pid);
      worker.on('message', (message: unknown) => {
        if (!isListening(message)) return;
        listening.set(worker, message.port);
        if (listening.size === options.workers) allListening.resolve(message.port);
      });
      worker.once('exit', (code, signal) => {
        live.delete(worker);
        if (!stopping && failure === undefined) {
          failure = new ServerWorkerExitedError(worker.id, worker.process.pid, code, signal);
          stopAll();
        }
        if (live.size === 0) exited.resolve();
      });
    }
    const port = await Promise.race([allListening.promise, woken.then(() => undefined)]);
    if (port !== undefined) {
      log('BMaaS server listening on %s:%d (%d workers)', options.listen.host, port, options.workers);
    }
    await woken;
    await exited.promise;
    if (failure) throw failure;
    log('stopped');
  } finally {
    for (const worker of live) worker.process.kill('SIGKILL');
    await webServer?.close();
    await bmdb?.close();
    if (metricsServer) await closeServer(metricsServer);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** `Promise.withResolvers`, which Node 20 lacks. */
function resolvers<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve: (value: T) => void = () => {};
  const promise = new Promise<T>((done) => {
    resolve = done;
  });
  return { promise, resolve };
}
