import { isUuid } from '@bmaas/common';
/** Machines as a person names them: by provider and provider ID, or by machine ID. */
import { type Kysely, sql } from 'kysely';
import type { Database } from '../schema.js';

/** A machine found by {@link lookUpMachines}, with the work running on it right now. */
export interface MachineRef {
  readonly machineId: string;
  /** Its Provided tag's provider and provider ID; `null` for a machine without one. */
  readonly provider: string | null;
  readonly providerId: string | null;
  /** Processes with work held on it by a live session. */
  readonly liveWork: readonly string[];
}

/** Which machines a person means: a provider's IDs, or machine IDs. */
export type MachineNames =
  | { readonly provider: string; readonly providerIds: readonly string[] }
  | { readonly machineIds: readonly string[] };

/** What {@link lookUpMachines} found, in the order asked, and the names it did not know. */
export interface MachineLookup {
  readonly found: readonly MachineRef[];
  /** Provider IDs (or machine IDs) the BMDB does not have, in the order asked. */
  readonly unknown: readonly string[];
}

/**
 * The machines a person names, by provider and provider IDs or by machine
 * IDs, with the work running on each; and the names the BMDB does not
 * know (a machine ID that is no UUID among them).
 */
export async function lookUpMachines(db: Kysely<Database>, names: MachineNames): Promise<MachineLookup> {
  const byMachine = 'machineIds' in names;
  const wanted = [...new Set(byMachine ? names.machineIds.map((id) => id.toLowerCase()) : names.providerIds)];
  if (wanted.length === 0) return { found: [], unknown: [] };
  const live = sql<string[]>`ARRAY(
    SELECT w.process FROM work w JOIN sessions s ON s.session_id = w.session_id
    WHERE w.machine_id = m.machine_id AND s.deadline > now() ORDER BY w.process)`;
  let query = db
    .selectFrom('machines as m')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
    .select(['m.machine_id', 'mp.provider', 'mp.provider_id', live.as('live_work')]);
  if (byMachine) {
    // A name that is no UUID names no machine (and must not reach a uuid comparison).
    const ids = wanted.filter((id) => isUuid(id));
    if (ids.length === 0) return { found: [], unknown: wanted };
    query = query.where('m.machine_id', 'in', ids);
  } else {
    query = query.where('mp.provider', '=', names.provider).where('mp.provider_id', 'in', wanted);
  }
  const rows = await query.execute();
  const byName = new Map(rows.map((row) => [byMachine ? row.machine_id : (row.provider_id ?? ''), row]));
  const found: MachineRef[] = [];
  const unknown: string[] = [];
  for (const name of wanted) {
    const row = byName.get(name);
    if (row === undefined) unknown.push(name);
    else {
      found.push({
        machineId: row.machine_id,
        provider: row.provider,
        providerId: row.provider_id,
        liveWork: row.live_work,
      });
    }
  }
  return { found, unknown };
}
