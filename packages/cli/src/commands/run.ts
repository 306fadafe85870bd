import type { Server } from 'node:http';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import type { FleetPageServer } from '@bmaas/web';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { ensureDirectory } from '../directory.js';
import { log } from '../logging.js';
import { closeServer, readFleet, serveMetrics } from '../metrics-server.js';
import type { Argv } from '../settings.js';
import { shepherdParts } from './run-loops.js';
import { type ProviderKind, runSettings } from './run-settings.js';
import { ABANDONED_GRACE, raceSignal, StartupStopped, settledWithin } from './startup-stop.js';
import { prepareWeb, serveWeb } from './web.js';

export type { ProviderKind } from './run-settings.js';

/**
 * `shepherd run <provider>`: provisioner, initializer and recoverer (and the
 * provider's own loop) in one process until SIGINT/SIGTERM, then a clean stop:
 * no work left claimed, sessions closed, the embedded database stopped. A
 * second signal exits at once.
 */
export async function run(argv: Argv, kind: ProviderKind): Promise<void> {
  // Signals count from the first moment: start-up may be stuck reading a file or creating a directory.
  const stop = new AbortController();
  let running = false;
  let stoppedBy: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    stoppedBy ??= signal;
    if (stop.signal.aborted) {
      log('second %s: exiting at once', signal);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    log(
      running
        ? '%s: stopping cleanly (no new work, in-flight work ends, sessions close); send it again to exit at once'
        : '%s: stopping start-up; send it again to exit at once',
      signal,
    );
    stop.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  // Start-up steps a signal made us stop waiting for, until they settle.
  const abandoned = new Set<Promise<unknown>>();
  const untilStopped = <T>(step: Promise<T>): Promise<T> => {
    const settled = () => abandoned.delete(step);
    return raceSignal(step, stop.signal, () => {
      abandoned.add(step);
      step.then(settled, settled);
    });
  };
  let bmdb: BMDB | undefined;
  let metricsServer: Server | undefined;
  log('starting with the %s provider', kind);
  let webServer: FleetPageServer | undefined;
  try {
    const settings = await untilStopped(runSettings(argv, kind));
    const page = settings.web && (await untilStopped(prepareWeb(settings.web)));
    if (settings.database.url === undefined) {
      await untilStopped(ensureDirectory('data-dir', settings.database.dataDir));
    }
    const registry = new Registry();
    collectDefaultMetrics({ register: registry });
    if (settings.metrics) metricsServer = await serveMetrics(registry, settings.metrics.listen);
    // Not abandoned on a signal: it may be starting a server, which the `finally` must stop.
    bmdb = await openBMDB(settings.database, { migrate: true, metrics: registry });
    if (stop.signal.aborted) throw new StartupStopped();
    if (settings.metrics) readFleet(bmdb, registry, settings.metrics, settings.recoverer);
    if (page) webServer = await serveWeb(bmdb, page, settings.recoverer);
    const parts = await untilStopped(shepherdParts(bmdb, settings, registry, argv));
    running = true;
    log(
      'running with the %s provider (%s); %s',
      kind,
      settings.database.url === undefined ? `embedded BMDB in ${settings.database.dataDir}` : 'BMDB at --bmdb-url',
      settings.metrics
        ? `metrics at ${settings.metrics.listen.host}:${settings.metrics.listen.port}`
        : 'no metrics endpoint',
    );
    await Promise.all(parts.map((part) => part(stop.signal)));
    log('stopped');
  } catch (error) {
    if (!(error instanceof StartupStopped)) throw error;
    log('stopped during start-up');
  } finally {
    await webServer?.close();
    await bmdb?.close();
    if (metricsServer) await closeServer(metricsServer);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (abandoned.size > 0 && stoppedBy) {
      // Most abandoned steps end soon (a query on the closed BMDB, an HTTP request). A call
      // stuck in the file system (a FIFO, a hung mount) holds a thread that even
      // process.exit() waits for; the signal's own default action ends the process.
      await settledWithin([...abandoned], ABANDONED_GRACE);
      if (abandoned.size > 0) {
        log('start-up is still waiting on the file system: ending the process by %s', stoppedBy);
        process.kill(process.pid, stoppedBy);
      }
    }
  }
}
