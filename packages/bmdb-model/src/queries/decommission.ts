/**
 * Decommissioning machines: removing them from the BMDB, after wiping their
 * disks where asked, and retiring them (see `retired-machines.ts`).
 */
import { type Kysely, sql } from 'kysely';
import { type Database, OSInstallationState, OSRequestKind } from '../schema.js';
import { requestDiskWipe } from './os-installation.js';

/** Who decommissions machines and why, recorded with each one's retirement. */
export interface DecommissionRequest {
  readonly actor?: string;
  readonly reason?: string;
}

/** What {@link decommissionMachines} did with each provider ID it was given. */
export interface DecommissionReport {
  /** Removed from the BMDB, with their tags and backoffs, and retired; their work history stays. */
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

/**
 * Removes the machines `providerIds` of `provider` from the BMDB: the
 * machine rows and, by cascade, their tags and backoffs. Machines with
 * work held by a live session (any process) are refused and left as they
 * are; work left behind by expired sessions goes with its machine. Work
 * history has no key on machines and stays, for the record.
 *
 * Each machine removed is retired, with `request`'s actor and reason: the
 * provisioner does not bring it back while its provider's inventory lists
 * it (see `recommissionMachines`).
 *
 * The machines are locked first (`FOR UPDATE`), so a claim racing with the
 * removal either lands first and is seen, or waits and then fails.
 */
export async function decommissionMachines(
  db: Kysely<Database>,
  provider: string,
  providerIds: readonly string[],
  request: DecommissionRequest = {},
): Promise<DecommissionReport> {
  return removeAndRetire(db, provider, providerIds, { ...request, wiped: false });
}

async function removeAndRetire(
  db: Kysely<Database>,
  provider: string,
  providerIds: readonly string[],
  retirement: DecommissionRequest & { readonly wiped: boolean },
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
    // Retired again, a machine brought back and decommissioned once more is remembered as it was last.
    await db
      .insertInto('machine_retired')
      .values(
        removed.map((row) => ({
          provider,
          provider_id: row.provider_id,
          machine_id: row.machine_id,
          retired_by: retirement.actor ?? null,
          retire_reason: retirement.reason ?? null,
          wiped: retirement.wiped,
        })),
      )
      .onConflict((oc) =>
        oc.columns(['provider', 'provider_id']).doUpdateSet((eb) => ({
          machine_id: eb.ref('excluded.machine_id'),
          retired_at: sql<Date>`now()`,
          retired_by: eb.ref('excluded.retired_by'),
          retire_reason: eb.ref('excluded.retire_reason'),
          wiped: eb.ref('excluded.wiped'),
        })),
      )
      .execute();
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

/** What {@link decommissionWithWipe} did with each provider ID it was given. */
export interface WipeDecommissionReport extends DecommissionReport {
  /** Their disk wipe is requested and not reported yet: removed once their agent reports success. */
  readonly wiping: readonly {
    readonly providerId: string;
    readonly machineId: string;
    readonly generation: bigint;
    /** Requested by this call (false: an earlier one, still under way). */
    readonly requestedNow: boolean;
  }[];
  /** Their agent reported the wipe failed: kept in the BMDB, with the agent's error. */
  readonly failed: readonly {
    readonly providerId: string;
    readonly machineId: string;
    readonly generation: bigint;
    readonly error: string;
  }[];
  /**
   * No agent runs on them (no AgentStarted tag) and none can be booted (their agent arrives over SSH):
   * nothing can wipe their disks yet; kept.
   */
  readonly noAgent: readonly { readonly providerId: string; readonly machineId: string }[];
}

/**
 * Decommissions machines after wiping their disks: a machine whose
 * decommission wipe succeeded is removed and retired (as
 * {@link decommissionMachines}, refused while live work is on it); one with a wipe under way is left to
 * it; one with a running agent and no such wipe (or a failed one, when
 * `retryFailed`) gets one requested (`decommission` set), as does one
 * without an agent whose BMC boots its agent (the agent booter boots one to
 * wipe it); one without an agent that arrives over SSH is refused, as is one
 * whose wipe failed (with its error). Its
 * machines' rows are locked first, so concurrent calls take turns.
 */
export async function decommissionWithWipe(
  db: Kysely<Database>,
  provider: string,
  providerIds: readonly string[],
  request: { readonly actor: string; readonly reason: string; readonly retryFailed: boolean },
): Promise<WipeDecommissionReport> {
  const wanted = [...new Set(providerIds)];
  const rows =
    wanted.length === 0
      ? []
      : await db
          .selectFrom('machines as m')
          .innerJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
          .leftJoin('machine_os_installation_request as q', 'q.machine_id', 'm.machine_id')
          .leftJoin('machine_agent_started as a', 'a.machine_id', 'm.machine_id')
          .leftJoin('machine_agent_boot as b', 'b.machine_id', 'm.machine_id')
          .select([
            'm.machine_id',
            'mp.provider_id',
            'q.request_kind',
            'q.decommission',
            'q.installation_state',
            'q.generation',
            'q.installation_error',
            'a.machine_id as agent',
            'b.boot_method',
          ])
          .where('mp.provider', '=', provider)
          .where('mp.provider_id', 'in', wanted)
          .orderBy('mp.provider_id')
          .forUpdate('m')
          .execute();
  const wiped: string[] = [];
  const wiping: Mutable<WipeDecommissionReport['wiping']> = [];
  const failed: Mutable<WipeDecommissionReport['failed']> = [];
  const noAgent: Mutable<WipeDecommissionReport['noAgent']> = [];
  for (const row of rows) {
    const ids = { providerId: row.provider_id, machineId: row.machine_id };
    const wipe = row.request_kind === OSRequestKind.DiskWipe && row.decommission === true;
    const state = row.installation_state;
    if (wipe && state === OSInstallationState.Succeeded) {
      wiped.push(row.provider_id);
    } else if (wipe && (state === OSInstallationState.Requested || state === OSInstallationState.Delivered)) {
      wiping.push({ ...ids, generation: BigInt(row.generation ?? 0), requestedNow: false });
    } else if (wipe && state === OSInstallationState.Failed && !request.retryFailed) {
      failed.push({
        ...ids,
        generation: BigInt(row.generation ?? 0),
        error: row.installation_error ?? 'the agent reported an error without a message',
      });
    } else if (row.agent === null && row.boot_method === null) {
      // A machine whose BMC boots its agent gets the request all the same: the agent booter boots the agent for it.
      noAgent.push(ids);
    } else {
      const requested = await requestDiskWipe(db, row.machine_id, {
        actor: request.actor,
        reason: request.reason,
        decommission: true,
      });
      wiping.push({ ...ids, generation: requested.generation, requestedNow: true });
    }
  }
  const found = new Set(rows.map((row) => row.provider_id));
  const removal = await removeAndRetire(db, provider, wiped, {
    actor: request.actor,
    reason: request.reason,
    wiped: true,
  });
  return {
    removed: removal.removed,
    busy: removal.busy,
    unknown: wanted.filter((id) => !found.has(id)).sort(),
    wiping,
    failed,
    noAgent,
  };
}

type Mutable<T extends readonly unknown[]> = T[number][];
