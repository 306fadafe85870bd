import { createHash } from 'node:crypto';
import type { BMDB, Database } from '@bmaas/bmdb-controlloop';
import {
  type BackoffCause,
  backoffCauses,
  databaseNow,
  type FleetControl,
  type FleetStages,
  findMachine,
  fleetStages,
  type LiveSession,
  liveSessions,
  liveWorkByProcess,
  type MachineDetail,
  type MachineFilter,
  type MachineSummary,
  machineDetail,
  machinePage,
  type OSInstallation,
  type OSInstallationCounts,
  osInstallationCounts,
  providers,
  type RecentFailure,
  type RecoveryThresholds,
  type RetiredMachine,
  recentFailures,
  retiredMachine,
  retiredMachineCount,
  retiredMachines,
  SHEPHERD_PROCESSES,
} from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';

/** The Kysely instance over the BMDB (`BMDB.db`). */
export type BMDBReader = BMDB['db'];

/**
 * Runs `read` in a READ ONLY transaction: the page cannot write to the BMDB
 * even by mistake. REPEATABLE READ gives one snapshot for a whole page
 * without the predicate locks SERIALIZABLE would take, which could make the
 * shepherds' own transactions fail.
 */
export function readOnly<T>(db: BMDBReader, read: (q: Kysely<Database>) => Promise<T>): Promise<T> {
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .setAccessMode('read only')
    .execute((trx) => read(trx));
}

/** What `/` and `/api/overview` show. */
export interface Overview extends FleetControl {
  readonly now: Date;
  readonly machines: number;
  readonly stages: FleetStages;
  /** Live work items per process. */
  readonly liveWork: Readonly<Record<string, number>>;
  readonly sessions: readonly LiveSession[];
  readonly backoffCauses: readonly BackoffCause[];
  readonly recentFailures: readonly RecentFailure[];
  /** Machines per OS installation state. */
  readonly installations: OSInstallationCounts;
  /** Retired (decommissioned) machines: the provisioner leaves them out while their provider lists them. */
  readonly retired: number;
  /** The most recently retired, at most {@link RETIRED_SHOWN}. */
  readonly retiredMachines: readonly RetiredMachine[];
}

/** Retired machines the overview lists. */
export const RETIRED_SHOWN = 20;

/**
 * The overview, from two read-only transactions run side by side: the stage
 * counts (one count over every machine, the bulk of the work) and the rest.
 * Both start together, so their snapshots are as close as two can be.
 */
export async function readOverview(db: BMDBReader, thresholds: RecoveryThresholds): Promise<Overview> {
  const [stages, rest] = await Promise.all([
    readOnly(db, (q) => fleetStages(q, thresholds)),
    readOnly(db, async (q) => ({
      now: await databaseNow(q),
      liveWork: await liveWorkByProcess(q),
      sessions: await liveSessions(q),
      backoffCauses: await backoffCauses(q, { limit: 20 }),
      recentFailures: await recentFailures(q, { limit: 20 }),
      installations: await osInstallationCounts(q),
      retired: await retiredMachineCount(q),
      retiredMachines: await retiredMachines(q, { limit: RETIRED_SHOWN }),
    })),
  ]);
  return { ...stages, ...rest };
}

/** What `/machines` and `/api/machines` show. */
export interface MachineList {
  readonly now: Date;
  readonly filter: MachineFilter;
  readonly machines: readonly MachineSummary[];
  /** `after` for the next page, if there is one. */
  readonly next: string | undefined;
  /** Providers and processes to offer as filters. */
  readonly providers: readonly string[];
  readonly processes: readonly string[];
}

export async function readMachineList(
  db: BMDBReader,
  filter: MachineFilter,
  thresholds: RecoveryThresholds,
): Promise<MachineList> {
  return readOnly(db, async (q) => {
    const page = await machinePage(q, filter, thresholds);
    const live = Object.keys(await liveWorkByProcess(q));
    return {
      now: await databaseNow(q),
      filter,
      machines: page.machines,
      next: page.next,
      providers: await providers(q),
      processes: [...new Set([...SHEPHERD_PROCESSES, ...live])].sort(),
    };
  });
}

/** An installation as the page shows it: the user-data's size, never its contents (it may hold secrets). */
export interface InstallationView extends Omit<OSInstallation, 'userData'> {
  readonly userDataBytes: number;
}

/** A machine's page: its detail with the agent key as a fingerprint only. */
export interface MachineView extends Omit<MachineDetail, 'agentPublicKey' | 'osInstallation'> {
  readonly osInstallation: InstallationView | null;
  readonly now: Date;
  /** `SHA256:…` of the agent's public key, if started. */
  readonly agentKeyFingerprint: string | null;
  /** The provider's console page of the machine, where the provider has one. */
  readonly consoleUrl: string | null;
}

export async function readMachine(
  db: BMDBReader,
  machineId: string,
  thresholds: RecoveryThresholds,
): Promise<MachineView | undefined> {
  return readOnly(db, async (q) => {
    const detail = await machineDetail(q, machineId, { ...thresholds, historyLimit: 500 });
    if (detail === undefined) return undefined;
    const { agentPublicKey, osInstallation, ...rest } = detail;
    return {
      ...rest,
      osInstallation: osInstallation && installationView(osInstallation),
      now: await databaseNow(q),
      agentKeyFingerprint: agentPublicKey === null ? null : fingerprint(agentPublicKey),
      consoleUrl: detail.provided ? consoleUrl(detail.provided.provider, detail.provided.providerId) : null,
    };
  });
}

/** The retirement of the machine that had `machineId`, for a page asked for a machine no longer in the BMDB. */
export function readRetiredMachine(db: BMDBReader, machineId: string): Promise<RetiredMachine | undefined> {
  return readOnly(db, (q) => retiredMachine(q, machineId));
}

function installationView(installation: OSInstallation): InstallationView {
  const { userData, ...rest } = installation;
  return { ...rest, userDataBytes: userData?.length ?? 0 };
}

/** The machine ID a search term names exactly (a machine ID or a unique provider ID), if any. */
export function readExactMatch(db: BMDBReader, term: string): Promise<string | undefined> {
  return readOnly(db, (q) => findMachine(q, term));
}

/** `SHA256:<base64>` of a public key, as OpenSSH prints fingerprints. */
export function fingerprint(publicKey: Uint8Array): string {
  return `SHA256:${createHash('sha256').update(publicKey).digest('base64').replace(/=+$/, '')}`;
}

/** Console pages of machines, by provider (the provider's `type`). */
const CONSOLES: Record<string, (providerId: string) => string> = {
  Equinix: (id) => `https://console.equinix.com/devices/${encodeURIComponent(id)}/overview`,
};

export function consoleUrl(provider: string, providerId: string): string | null {
  return CONSOLES[provider]?.(providerId) ?? null;
}
