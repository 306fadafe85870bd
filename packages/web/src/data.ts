import { createHash } from 'node:crypto';
import {
  type BackoffCause,
  type BMDB,
  type FleetControl,
  type FleetStages,
  type LiveSession,
  type MachineDetail,
  type MachineFilter,
  type MachineSummary,
  type OSInstallation,
  type OSInstallationCounts,
  Queries,
  type RecentFailure,
  type RecoveryThresholds,
  SHEPHERD_PROCESSES,
} from '@bmaas/bmdb-controlloop';

/** The Kysely instance over the BMDB (`BMDB.db`). */
export type BMDBReader = BMDB['db'];

/**
 * Runs `read` in a READ ONLY transaction: the page cannot write to the BMDB
 * even by mistake. REPEATABLE READ gives one snapshot for a whole page
 * without the predicate locks SERIALIZABLE would take, which could make the
 * shepherds' own transactions fail.
 */
export function readOnly<T>(db: BMDBReader, read: (q: Queries) => Promise<T>): Promise<T> {
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .setAccessMode('read only')
    .execute((trx) => read(new Queries(trx)));
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
}

/**
 * The overview, from two read-only transactions run side by side: the stage
 * counts (one count over every machine, the bulk of the work) and the rest.
 * Both start together, so their snapshots are as close as two can be.
 */
export async function readOverview(db: BMDBReader, thresholds: RecoveryThresholds): Promise<Overview> {
  const [stages, rest] = await Promise.all([
    readOnly(db, (q) => q.fleetStages(thresholds)),
    readOnly(db, async (q) => ({
      now: await q.now(),
      liveWork: await q.liveWorkByProcess(),
      sessions: await q.liveSessions(),
      backoffCauses: await q.backoffCauses({ limit: 20 }),
      recentFailures: await q.recentFailures({ limit: 20 }),
      installations: await q.osInstallationCounts(),
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
    const page = await q.machinePage(filter, thresholds);
    const live = Object.keys(await q.liveWorkByProcess());
    return {
      now: await q.now(),
      filter,
      machines: page.machines,
      next: page.next,
      providers: await q.providers(),
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
    const detail = await q.machineDetail(machineId, { ...thresholds, historyLimit: 500 });
    if (detail === undefined) return undefined;
    const { agentPublicKey, osInstallation, ...rest } = detail;
    return {
      ...rest,
      osInstallation: osInstallation && installationView(osInstallation),
      now: await q.now(),
      agentKeyFingerprint: agentPublicKey === null ? null : fingerprint(agentPublicKey),
      consoleUrl: detail.provided ? consoleUrl(detail.provided.provider, detail.provided.providerId) : null,
    };
  });
}

function installationView(installation: OSInstallation): InstallationView {
  const { userData, ...rest } = installation;
  return { ...rest, userDataBytes: userData?.length ?? 0 };
}

/** The machine ID a search term names exactly (a machine ID or a unique provider ID), if any. */
export function findMachine(db: BMDBReader, term: string): Promise<string | undefined> {
  return readOnly(db, (q) => q.findMachine(term));
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
