/** Removing machines a provider no longer has. */
import { type Kysely, sql } from 'kysely';
import type { Database } from '../schema.js';

/** What {@link Queries.decommissionMachines} did with each provider ID it was given. */
export interface DecommissionReport {
  /** Removed from the BMDB, with their tags and backoffs; their work history stays. */
  readonly removed: readonly { readonly providerId: string; readonly machineId: string }[];
  /** Refused: work of these processes is held on them by a live session. */
  readonly busy: readonly {
    readonly providerId: string;
    readonly machineId: string;
    readonly processes: readonly string[];
  }[];
  /** Not in the BMDB under this provider. */
  readonly unknown: readonly string[];
}

export async function decommissionMachines(
  db: Kysely<Database>,
  provider: string,
  providerIds: readonly string[],
): Promise<DecommissionReport> {
  const wanted = [...new Set(providerIds)];
  if (wanted.length === 0) return { removed: [], busy: [], unknown: [] };
  const rows = await db
    .selectFrom('machines as m')
    .innerJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
    .select([
      'm.machine_id',
      'mp.provider_id',
      sql<string[]>`ARRAY(
        SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND s.deadline > now() ORDER BY w.process)`.as('live'),
    ])
    .where('mp.provider', '=', provider)
    .where('mp.provider_id', 'in', wanted)
    .orderBy('mp.provider_id')
    .forUpdate('m')
    .execute();
  const removed = rows.filter((row) => row.live.length === 0);
  const ids = removed.map((row) => row.machine_id);
  if (ids.length > 0) {
    // Only dead work is left on them: its key on machines would block the delete.
    await db.deleteFrom('work').where('machine_id', 'in', ids).execute();
    await db.deleteFrom('machines').where('machine_id', 'in', ids).execute();
  }
  const found = new Set(rows.map((row) => row.provider_id));
  return {
    removed: removed.map((row) => ({ providerId: row.provider_id, machineId: row.machine_id })),
    busy: rows
      .filter((row) => row.live.length > 0)
      .map((row) => ({ providerId: row.provider_id, machineId: row.machine_id, processes: row.live })),
    unknown: wanted.filter((id) => !found.has(id)).sort(),
  };
}
