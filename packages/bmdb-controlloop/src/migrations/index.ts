import { describeError } from '@bmaas/common';
import { type Kysely, type Migration, type MigrationProvider, Migrator } from 'kysely';
import { BMDBError } from '../errors.js';
import { log } from '../internal/log.js';
import * as initial from './0001_initial.js';
import * as fastClaims from './0002_fast_claims.js';
import * as agentReports from './0003_agent_reports.js';
import * as fleetPage from './0004_fleet_page.js';
import * as leanTriggers from './0005_lean_triggers.js';
import * as operatorControl from './0006_operator_control.js';
import * as fleetMetrics from './0008_fleet_metrics.js';
import * as osInstallation from './0009_os_installation.js';
import * as installationReportKey from './0010_installation_report_key.js';
import * as rootDeviceHints from './0011_root_device_hints.js';
import * as diskWipe from './0012_disk_wipe.js';
import * as agentLog from './0013_agent_log.js';
import * as agentEnrollment from './0014_agent_enrollment.js';
import * as agentBootMethod from './0015_agent_boot_method.js';
import * as networkBoot from './0016_network_boot.js';
import * as retiredMachines from './0018_retired_machines.js';
import * as firstBoot from './0019_first_boot.js';

/**
 * Every migration, in order. Names sort lexically and are recorded in the
 * database; released migrations are never edited or renamed.
 */
const MIGRATIONS: Record<string, Migration> = {
  '0001_initial': initial,
  '0002_fast_claims': fastClaims,
  '0003_agent_reports': agentReports,
  '0004_fleet_page': fleetPage,
  '0005_lean_triggers': leanTriggers,
  '0006_operator_control': operatorControl,
  // There is no 0007: OS installation was written as 0007 but released after
  // 0008, so it runs after it as 0009.
  '0008_fleet_metrics': fleetMetrics,
  '0009_os_installation': osInstallation,
  '0010_installation_report_key': installationReportKey,
  '0011_root_device_hints': rootDeviceHints,
  '0012_disk_wipe': diskWipe,
  '0013_agent_log': agentLog,
  '0014_agent_enrollment': agentEnrollment,
  '0015_agent_boot_method': agentBootMethod,
  '0016_network_boot': networkBoot,
  '0018_retired_machines': retiredMachines,
  '0019_first_boot': firstBoot,
};

/** Migration bookkeeping tables; prefixed so they sit apart from other tools'. */
const MIGRATION_TABLE = 'bmdb_migration';
const MIGRATION_LOCK_TABLE = 'bmdb_migration_lock';

/**
 * A component's own part of the BMDB: tables of its own (its tags, keyed by
 * `machine_id`), created and changed by its own migrations. `BMDB.open` with
 * `migrate: true` applies them after the library's, recording them apart
 * from the library's and other components' (table `bmdb_migration_<name>`),
 * so library migrations added later never collide with a component's.
 */
export interface ComponentSchema {
  /**
   * The component, as named in its migration records: lower-case letters,
   * digits and underscores, starting with a letter, at most 40 characters.
   */
  readonly name: string;
  /**
   * The component's migrations by name (Kysely's `{ up(db), down?(db) }`).
   * Applied once each, in the names' lexical order (`0001_…`, `0002_…`); a
   * name sorting before one already applied is refused. Never edit or rename
   * a released one.
   */
  readonly migrations: Readonly<Record<string, Migration>>;
}

const COMPONENT_NAME = /^[a-z][a-z0-9_]{0,39}$/;

/**
 * Checks component schemas before anything is touched.
 *
 * @throws {@link BMDBError} naming a bad or repeated component name, or a component without migrations
 */
export function checkComponents(components: readonly ComponentSchema[]): void {
  const seen = new Set<string>();
  for (const { name, migrations } of components) {
    if (!COMPONENT_NAME.test(name)) {
      throw new BMDBError(
        `component schema name ${JSON.stringify(name)} is invalid: want lower-case letters, digits and underscores, starting with a letter, at most 40 characters`,
      );
    }
    if (seen.has(name)) throw new BMDBError(`component schema ${name} is given twice`);
    seen.add(name);
    if (Object.keys(migrations).length === 0) throw new BMDBError(`component schema ${name} has no migrations`);
  }
}

/**
 * Brings the schema to the latest version: the library's migrations, then
 * each component's, in the order given. Safe to run from several processes
 * at once (Kysely holds an advisory lock) and a no-op when up to date.
 *
 * @returns the names of the migrations applied by this call; a component's
 *   as `<component>/<migration>`
 */
export async function migrateToLatest(
  db: Kysely<unknown>,
  components: readonly ComponentSchema[] = [],
): Promise<string[]> {
  const applied = await migrate(db, MIGRATIONS, MIGRATION_TABLE, MIGRATION_LOCK_TABLE, 'BMDB');
  for (const { name, migrations } of components) {
    const table = `${MIGRATION_TABLE}_${name}`;
    const names = await migrate(db, migrations, table, `${table}_lock`, `component ${name}`);
    applied.push(...names.map((migration) => `${name}/${migration}`));
  }
  log.migrate(applied.length ? 'applied %o' : 'schema up to date', applied);
  return applied;
}

async function migrate(
  db: Kysely<unknown>,
  migrations: Readonly<Record<string, Migration>>,
  migrationTableName: string,
  migrationLockTableName: string,
  what: string,
): Promise<string[]> {
  const provider: MigrationProvider = { getMigrations: async () => ({ ...migrations }) };
  const migrator = new Migrator({ db, provider, migrationTableName, migrationLockTableName });
  const { error, results = [] } = await migrator.migrateToLatest();
  const failed = results.find((r) => r.status === 'Error');
  if (error !== undefined || failed) {
    throw new BMDBError(`${what} migration ${failed?.migrationName ?? '(none)'} failed: ${describeError(error)}`, {
      cause: error,
    });
  }
  return results.filter((r) => r.status === 'Success').map((r) => r.migrationName);
}
