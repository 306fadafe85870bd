import { type Kysely, type Migration, type MigrationProvider, Migrator } from 'kysely';
import { BMDBError } from '../errors.js';
import { log } from '../internal/log.js';
import * as initial from './0001_initial.js';
import * as fastClaims from './0002_fast_claims.js';
import * as agentReports from './0003_agent_reports.js';
import * as fleetPage from './0004_fleet_page.js';

/**
 * Every migration, in order. Names sort lexically and are recorded in the
 * database; released migrations are never edited or renamed.
 */
const MIGRATIONS: Record<string, Migration> = {
  '0001_initial': initial,
  '0002_fast_claims': fastClaims,
  '0003_agent_reports': agentReports,
  '0004_fleet_page': fleetPage,
};

const provider: MigrationProvider = { getMigrations: async () => MIGRATIONS };

/** Migration bookkeeping tables; prefixed so they sit apart from other tools'. */
const MIGRATION_TABLE = 'bmdb_migration';
const MIGRATION_LOCK_TABLE = 'bmdb_migration_lock';

/**
 * Brings the schema to the latest version. Safe to run from several processes
 * at once (Kysely holds an advisory lock) and a no-op when up to date.
 *
 * @returns the names of the migrations applied by this call
 */
export async function migrateToLatest(db: Kysely<unknown>): Promise<string[]> {
  const migrator = new Migrator({
    db,
    provider,
    migrationTableName: MIGRATION_TABLE,
    migrationLockTableName: MIGRATION_LOCK_TABLE,
  });
  const { error, results = [] } = await migrator.migrateToLatest();
  const failed = results.find((r) => r.status === 'Error');
  if (error !== undefined || failed) {
    throw new BMDBError(
      `BMDB migration ${failed?.migrationName ?? '(none)'} failed: ${error instanceof Error ? error.message : String(error)}`,
      { cause: error },
    );
  }
  const applied = results.filter((r) => r.status === 'Success').map((r) => r.migrationName);
  log.migrate(applied.length ? 'applied %o' : 'schema up to date', applied);
  return applied;
}
