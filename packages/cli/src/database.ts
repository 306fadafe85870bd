import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { BMDB, DatabaseUnreachableError, type Session } from '@bmaas/bmdb-controlloop';
import type { Registry } from 'prom-client';
import { ensureDirectory } from './directory.js';
import { log } from './logging.js';
import { type Argv, type DatabaseSettings, databaseSettings, UsageError } from './settings.js';
import { VERSION } from './version.js';

/** What the commands need of the BMDB beyond where it is. */
export interface OpenOptions {
  readonly migrate: boolean;
  readonly metrics?: Registry | undefined;
  /**
   * A command that only reads (status) attaches to the embedded server a
   * running shepherd owns, and refuses a data directory that has none yet.
   */
  readonly readOnly?: boolean;
  /**
   * A command that acts on machines of a BMDB (hold, power) refuses, like a
   * read-only one, a data directory without one rather than create it.
   */
  readonly mustExist?: boolean;
  /** Use the embedded server a running shepherd owns rather than refuse (status, migrate). */
  readonly attach?: boolean;
}

/**
 * Opens the BMDB at `--bmdb-url`, or the embedded one under `--data-dir`. An
 * unreachable database is bad input (exit 2), named by its flag.
 */
export async function openBMDB(settings: DatabaseSettings, options: OpenOptions): Promise<BMDB> {
  const common = {
    migrate: options.migrate,
    componentName: settings.componentName,
    runtimeInfo: `shepherd-ts ${VERSION} on ${hostname()} (pid ${process.pid})`,
    sessionInterval: settings.sessionInterval,
    ...(options.metrics ? { metrics: options.metrics } : {}),
  };
  if (settings.url !== undefined) {
    try {
      return await BMDB.open({ ...common, url: settings.url });
    } catch (error) {
      if (error instanceof DatabaseUnreachableError) throw new UsageError('bmdb-url', error.message);
      throw error;
    }
  }
  const mustExist = options.readOnly || options.mustExist;
  if (mustExist && !existsSync(path.join(settings.dataDir, 'pgdata', 'PG_VERSION'))) {
    throw new UsageError(
      'data-dir',
      `no BMDB under ${settings.dataDir} yet (start \`shepherd run\` or \`shepherd migrate\` first, or pass --bmdb-url)`,
    );
  }
  if (!mustExist) await ensureDirectory('data-dir', settings.dataDir);
  if (!existsSync(path.join(settings.dataDir, 'pgdata', 'PG_VERSION'))) {
    log('initialising a new embedded BMDB in %s (the first start takes a few seconds)', settings.dataDir);
  }
  return BMDB.open({ ...common, embedded: { dataDir: settings.dataDir, attach: options.attach ?? false } });
}

/**
 * Runs `fn` with a session of its own on the BMDB of the command's flags
 * (one that exists: an embedded one is not created); closes both after.
 */
export async function withSession<T>(
  argv: Argv,
  processor: string,
  fn: (session: Session, bmdb: BMDB) => Promise<T>,
): Promise<T> {
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, mustExist: true, attach: true });
  try {
    const session = await bmdb.startSession({ processor });
    try {
      return await fn(session, bmdb);
    } finally {
      await session.close();
    }
  } finally {
    await bmdb.close();
  }
}
