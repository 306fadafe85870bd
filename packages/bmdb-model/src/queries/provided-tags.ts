/** Machines and their Provided tag: what a provider knows of a machine. */
import type { Kysely } from 'kysely';
import type { Database, MachineProvidedRow, ProviderStatus } from '../schema.js';

/** A machine as its provider knows it: the Provided tag. */
export interface ProvidedMachine {
  readonly machineId: string;
  readonly provider: string;
  readonly providerId: string;
  readonly providerReservationId: string | null;
  readonly providerIpAddress: string | null;
  readonly providerLocation: string | null;
  readonly providerStatus: ProviderStatus | null;
}

/** The Provided tag's fields when adding it. */
export interface NewProvided {
  readonly provider: string;
  readonly providerId: string;
  readonly providerReservationId?: string | null;
  readonly providerIpAddress?: string | null;
  readonly providerLocation?: string | null;
  readonly providerStatus?: ProviderStatus | null;
}

/**
 * Fields of the Provided tag a provider's status updater refreshes. Fields
 * left `undefined` keep their stored value.
 */
export interface ProviderStatusUpdate {
  readonly providerReservationId?: string | null;
  readonly providerIpAddress?: string | null;
  readonly providerLocation?: string | null;
  readonly providerStatus?: ProviderStatus | null;
}

/** Creates a machine and returns its ID. */
export async function newMachine(db: Kysely<Database>): Promise<string> {
  const row = await db.insertInto('machines').defaultValues().returning('machine_id').executeTakeFirstOrThrow();
  return row.machine_id;
}

/** Adds the Provided tag: the machine is now known to `provider` as `providerId`. */
export async function addProvided(db: Kysely<Database>, machineId: string, tag: NewProvided): Promise<void> {
  await db
    .insertInto('machine_provided')
    .values({
      machine_id: machineId,
      provider: tag.provider,
      provider_id: tag.providerId,
      provider_reservation_id: tag.providerReservationId ?? null,
      provider_ip_address: tag.providerIpAddress ?? null,
      provider_location: tag.providerLocation ?? null,
      provider_status: tag.providerStatus ?? null,
    })
    .execute();
}

/**
 * Updates the provider-side facts of the machine `providerId` of `provider`.
 *
 * @returns whether such a machine exists
 */
export async function updateProviderStatus(
  db: Kysely<Database>,
  provider: string,
  providerId: string,
  update: ProviderStatusUpdate,
): Promise<boolean> {
  const set: Partial<MachineProvidedRow> = {};
  if (update.providerReservationId !== undefined) set.provider_reservation_id = update.providerReservationId;
  if (update.providerIpAddress !== undefined) set.provider_ip_address = update.providerIpAddress;
  if (update.providerLocation !== undefined) set.provider_location = update.providerLocation;
  if (update.providerStatus !== undefined) set.provider_status = update.providerStatus;
  if (Object.keys(set).length === 0) {
    const found = await db
      .selectFrom('machine_provided')
      .select('machine_id')
      .where('provider', '=', provider)
      .where('provider_id', '=', providerId)
      .executeTakeFirst();
    return found !== undefined;
  }
  const result = await db
    .updateTable('machine_provided')
    .set(set)
    .where('provider', '=', provider)
    .where('provider_id', '=', providerId)
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

/** Every machine provided by `provider`, ordered by provider ID. */
export async function providedMachines(db: Kysely<Database>, provider: string): Promise<ProvidedMachine[]> {
  const rows = await db
    .selectFrom('machine_provided')
    .selectAll()
    .where('provider', '=', provider)
    .orderBy('provider_id')
    .execute();
  return rows.map(toProvidedMachine);
}

/** The Provided tag of one machine, if it has one. */
export async function providedMachine(db: Kysely<Database>, machineId: string): Promise<ProvidedMachine | undefined> {
  const row = await db
    .selectFrom('machine_provided')
    .selectAll()
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return row && toProvidedMachine(row);
}

export function toProvidedMachine(row: MachineProvidedRow): ProvidedMachine {
  return {
    machineId: row.machine_id,
    provider: row.provider,
    providerId: row.provider_id,
    providerReservationId: row.provider_reservation_id,
    providerIpAddress: row.provider_ip_address,
    providerLocation: row.provider_location,
    providerStatus: row.provider_status,
  };
}
