/**
 * Retired machines: decommissioned, remembered by provider and provider ID
 * (migration 0018) so that the provisioner does not bring them back from an
 * inventory that still lists them.
 */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { isUuid } from '@bmaas/common';
import { type Kysely, type Selectable, sql } from 'kysely';
import type { Database, MachineRetiredTable } from '../schema.js';

/** A decommissioned machine, as the BMDB remembers it. */
export interface RetiredMachine {
  readonly provider: string;
  readonly providerId: string;
  /** The machine ID it had; its work and operator history are kept under it. */
  readonly machineId: string;
  readonly retiredAt: Date;
  /** Who decommissioned it, and why; null when not said. */
  readonly actor: string | null;
  readonly reason: string | null;
  /** Whether its disks were wiped first (`decommission --wipe`). */
  readonly wiped: boolean;
}

/** Retired machines, most recently retired first (default at most 100), of `provider` or of every provider. */
export async function retiredMachines(
  db: Kysely<Database>,
  options: { readonly provider?: string; readonly limit?: number } = {},
): Promise<RetiredMachine[]> {
  let query = db.selectFrom('machine_retired').selectAll();
  if (options.provider !== undefined) query = query.where('provider', '=', options.provider);
  const rows = await query
    .orderBy('retired_at', 'desc')
    .orderBy('provider')
    .orderBy('provider_id')
    .limit(options.limit ?? 100)
    .execute();
  return rows.map(toRetiredMachine);
}

/** The retirement of the machine that had `machineId`, if it is retired (the latest, were the ID ever reused). */
export async function retiredMachine(db: Kysely<Database>, machineId: string): Promise<RetiredMachine | undefined> {
  if (!isUuid(machineId)) return undefined;
  const row = await db
    .selectFrom('machine_retired')
    .selectAll()
    .where('machine_id', '=', machineId)
    .orderBy('retired_at', 'desc')
    .limit(1)
    .executeTakeFirst();
  return row && toRetiredMachine(row);
}

/** How many machines are retired, of every provider. */
export async function retiredMachineCount(db: Kysely<Database>): Promise<number> {
  const row = await db
    .selectFrom('machine_retired')
    .select(sql<number>`count(*)::int`.as('n'))
    .executeTakeFirstOrThrow();
  return row.n;
}

/** The provider IDs of `provider`'s retired machines: those its provisioner does not bring in. */
export async function retiredProviderIds(db: Kysely<Database>, provider: string): Promise<Set<string>> {
  const rows = await db.selectFrom('machine_retired').select('provider_id').where('provider', '=', provider).execute();
  return new Set(rows.map((row) => row.provider_id));
}

/**
 * Forgets the retired machines of `provider` that `listed` (every provider
 * ID its inventory lists now) leaves out: their entry left the inventory, so
 * one added again under the same ID is a new machine.
 *
 * @returns the provider IDs forgotten, sorted
 */
export async function forgetUnlistedRetiredMachines(
  db: Kysely<Database>,
  provider: string,
  listed: readonly string[],
): Promise<string[]> {
  const rows = await db
    .deleteFrom('machine_retired')
    .where('provider', '=', provider)
    .where(sql<boolean>`provider_id <> ALL (${[...listed]}::text[])`)
    .returning('provider_id')
    .execute();
  return rows.map((row) => row.provider_id).sort();
}

/** Some provider IDs given to {@link recommissionMachines} are not retired; nothing was recommissioned. */
export class NotRetiredError extends BMDBError {
  override name = 'NotRetiredError';
  constructor(
    readonly provider: string,
    /** The provider IDs that are not retired, each with the machine the BMDB has under it, if any. */
    readonly notRetired: readonly { readonly providerId: string; readonly machineId: string | undefined }[],
  ) {
    const named = notRetired.map(({ providerId, machineId }) =>
      machineId === undefined
        ? `${provider} ${providerId} (not in the BMDB)`
        : `${provider} ${providerId} (machine ${machineId}, in service)`,
    );
    super(`not retired, so not recommissioned: ${named.join(', ')}; nothing was recommissioned`);
  }
}

/**
 * Recommissions retired machines of `provider`: forgets their retirement, so
 * that the provisioner brings each in again (as a new machine) at its next
 * pass, if its inventory still lists it. All or nothing: a provider ID that
 * is not retired fails the call before anything changes.
 *
 * @returns the retirements forgotten, in provider ID order
 * @throws {@link NotRetiredError} naming each provider ID that is not retired
 */
export async function recommissionMachines(
  db: Kysely<Database>,
  provider: string,
  providerIds: readonly string[],
): Promise<RetiredMachine[]> {
  const wanted = [...new Set(providerIds)].sort();
  if (wanted.length === 0) return [];
  // Locked, so a concurrent decommission or recommission of the same machines waits for this one.
  const rows = await db
    .selectFrom('machine_retired')
    .selectAll()
    .where('provider', '=', provider)
    .where('provider_id', 'in', wanted)
    .orderBy('provider_id')
    .forUpdate()
    .execute();
  const found = new Set(rows.map((row) => row.provider_id));
  const missing = wanted.filter((id) => !found.has(id));
  if (missing.length > 0) {
    const inService = await db
      .selectFrom('machine_provided')
      .select(['provider_id', 'machine_id'])
      .where('provider', '=', provider)
      .where('provider_id', 'in', missing)
      .execute();
    const machines = new Map(inService.map((row) => [row.provider_id, row.machine_id]));
    throw new NotRetiredError(
      provider,
      missing.map((providerId) => ({ providerId, machineId: machines.get(providerId) })),
    );
  }
  await db.deleteFrom('machine_retired').where('provider', '=', provider).where('provider_id', 'in', wanted).execute();
  return rows.map(toRetiredMachine);
}

function toRetiredMachine(row: Selectable<MachineRetiredTable>): RetiredMachine {
  return {
    provider: row.provider,
    providerId: row.provider_id,
    machineId: row.machine_id,
    retiredAt: row.retired_at,
    actor: row.retired_by,
    reason: row.retire_reason,
    wiped: row.wiped,
  };
}
