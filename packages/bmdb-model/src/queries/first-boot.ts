/** The installed OS's report of its first boot, checked against its installation's secret. */
import { createHash } from 'node:crypto';
import { BMDBError } from '@bmaas/bmdb-controlloop';
import { isUuid } from '@bmaas/common';
import { type Kysely, sql } from 'kysely';
import { checkSshPublicKey } from '../first-boot.js';
import { type Database, OSInstallationState, OSRequestKind } from '../schema.js';
import { FIRST_BOOT_BOUND_MINUTES, type FirstBoot } from './os-installation.js';

/** What the installed OS sent: its installation's secret (from its config drive) and its SSH host keys. */
export interface FirstBootReport {
  readonly secret: string;
  /** OpenSSH public keys, one a line as in `/etc/ssh/ssh_host_*_key.pub`. */
  readonly hostKeys: readonly string[];
}

/**
 * What became of a first boot's report: `booted` (recorded now),
 * `repeated` (recorded before with this secret: nothing written, as an OS
 * retrying a lost answer expects), or `refused` (no succeeded installation
 * of the machine holds that secret: nothing written).
 */
export type FirstBootOutcome =
  | { readonly result: 'booted' | 'repeated'; readonly bootedAt: Date; readonly hostKeys: readonly string[] }
  | { readonly result: 'refused' };

/** The secrets agents write: 32 random bytes, base64url. */
const SECRET = /^[A-Za-z0-9_-]{43}$/;

/** sha256 of a first-boot secret, as the agent reports it and the BMDB stores it. */
export function bootSecretSha256(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
}

/**
 * Records that the machine's installed OS booted: its current request, a
 * disk image that `Succeeded`, must hold the sha256 of `report.secret`
 * (its agent's `Success` report put it there). The first such report sets
 * `booted_at` to the database's now and stores the host keys; later ones
 * with the same secret change nothing. A wrong secret, another machine's,
 * or one of an installation since replaced is refused, and writes nothing.
 *
 * @throws {@link BMDBError} for a machine ID that is not a UUID, a secret of
 *   the wrong form, or a host key that is not an OpenSSH public key (naming it)
 */
export async function recordFirstBoot(
  db: Kysely<Database>,
  machineId: string,
  report: FirstBootReport,
): Promise<FirstBootOutcome> {
  const what = `first boot report of machine ${machineId}`;
  if (!isUuid(machineId))
    throw new BMDBError(`first boot report: machine ID ${JSON.stringify(machineId)} is not a UUID`);
  if (!SECRET.test(report.secret)) throw new BMDBError(`${what}: the secret is not 43 base64url characters`);
  const hostKeys = report.hostKeys.map((key) => checkSshPublicKey(key, `${what}: host key`));
  const hash = bootSecretSha256(report.secret);
  const booted = await db
    .updateTable('machine_os_installation_request')
    .set({ booted_at: sql<Date>`now()`, booted_host_keys: hostKeys })
    .where('machine_id', '=', machineId)
    .where('installation_state', '=', OSInstallationState.Succeeded)
    .where('request_kind', '=', OSRequestKind.DiskImage)
    .where('boot_secret_sha256', '=', hash)
    .where('booted_at', 'is', null)
    .returning(['booted_at', 'booted_host_keys'])
    .executeTakeFirst();
  if (booted?.booted_at) return { result: 'booted', bootedAt: booted.booted_at, hostKeys };
  const before = await db
    .selectFrom('machine_os_installation_request')
    .select(['booted_at', 'booted_host_keys'])
    .where('machine_id', '=', machineId)
    .where('installation_state', '=', OSInstallationState.Succeeded)
    .where('boot_secret_sha256', '=', hash)
    .where('booted_at', 'is not', null)
    .executeTakeFirst();
  if (before?.booted_at)
    return { result: 'repeated', bootedAt: before.booted_at, hostKeys: before.booted_host_keys ?? [] };
  return { result: 'refused' };
}

/** Succeeded disk image installations per first boot: see `OSInstallation.firstBoot`. */
export type FirstBootCounts = Readonly<Record<FirstBoot, number>>;

/**
 * Succeeded disk image installations by where their OS stands: `booted`,
 * `booting` (within the bound) and `installed-not-booted`, by the
 * database's clock.
 */
export async function firstBootCounts(db: Kysely<Database>): Promise<FirstBootCounts> {
  const { rows } = await sql<{ booted: number; booting: number; not_booted: number }>`
    SELECT count(*) FILTER (WHERE booted_at IS NOT NULL)::int AS booted,
      count(*) FILTER (WHERE booted_at IS NULL AND installation_ended_at >= ${overdueSince})::int AS booting,
      count(*) FILTER (WHERE booted_at IS NULL AND installation_ended_at < ${overdueSince})::int AS not_booted
    FROM machine_os_installation_request
    WHERE installation_state = 'Succeeded' AND request_kind = 'DiskImage'`.execute(db);
  const row = rows[0];
  return { booted: row?.booted ?? 0, booting: row?.booting ?? 0, 'installed-not-booted': row?.not_booted ?? 0 };
}

const overdueSince = sql`now() - make_interval(mins => ${FIRST_BOOT_BOUND_MINUTES})`;
