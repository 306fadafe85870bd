import { performance } from 'node:perf_hooks';
import type { BMDB, Session } from '@bmaas/bmdb-controlloop';
import { runRounds } from '@bmaas/bmdb-controlloop';
import type { ProvidedMachine, ProviderStatusUpdate } from '@bmaas/bmdb-model';
import { ProviderStatus, providedMachines, updateProviderStatus } from '@bmaas/bmdb-model';
import { describeError, isAbortOf } from '@bmaas/common';
import type { EquinixClient } from '../api/client.js';
import type { EquinixDevice } from '../api/types.js';
import { EquinixApiError } from '../errors.js';
import { log } from '../internal/log.js';
import { deviceAddress, deviceFacts, EQUINIX_PROVIDER } from '../provider/device-facts.js';

/** Options for {@link EquinixStatusUpdater}. Durations in milliseconds. */
export interface EquinixStatusUpdaterOptions {
  readonly client: EquinixClient;
  readonly projectId: string;
  /**
   * Pause between passes. Machines whose facts are incomplete or changing (no
   * address yet, provisioning, powering on) are rechecked every pass. Default 30 s.
   */
  readonly pollInterval?: number | undefined;
  /** How often machines whose facts are complete and stable are rechecked. Default 10 min. */
  readonly settledInterval?: number | undefined;
  /** BMDB updates per transaction. Default 100. */
  readonly batchSize?: number | undefined;
}

/** What one pass did. */
export interface StatusSyncReport {
  /** Machines provided by Equinix in the BMDB. */
  readonly machines: number;
  /** Machines whose device was looked at. */
  readonly checked: number;
  /** Machines whose BMDB record changed. */
  readonly updated: number;
  /** Machines whose device no longer exists (now `Missing`). */
  readonly missing: number;
  /** How devices were fetched: one bulk `list`, one `get` per machine, or `none` (nothing due). */
  readonly fetch: 'list' | 'get' | 'none';
}

/** The `processor` label of the updater's BMDB session. */
export const STATUS_UPDATER_PROCESSOR = 'shepherd-equinix-status-updater';

/** Device states that do not change without someone acting on the device. */
const STABLE_STATES = new Set(['active', 'inactive', 'failed', 'deleted']);

/**
 * Keeps the Provided tag of every machine provided by Equinix in step with
 * the API: provider status, IP address, location and reservation ID.
 *
 * Each pass reads the machines from the BMDB, picks those due for a check,
 * fetches their devices with whichever costs fewer requests (one bulk,
 * paged listing of the project, or one GET per machine), and writes only
 * what changed. A device the API answers 404 for is `Missing`. Machines still
 * settling are checked every pass, settled ones every `settledInterval`. All
 * API calls go through the client's concurrency and rate limits.
 */
export class EquinixStatusUpdater {
  readonly #client: EquinixClient;
  readonly #projectId: string;
  readonly #pollInterval: number;
  readonly #settledInterval: number;
  readonly #batchSize: number;
  /** Provider ID → when it is next due (performance.now()); absent means due now. */
  readonly #nextCheck = new Map<string, number>();
  /** Pages of the last bulk listing: the price of the next one. */
  #listPages: number | undefined;

  constructor(options: EquinixStatusUpdaterOptions) {
    this.#client = options.client;
    this.#projectId = options.projectId;
    this.#pollInterval = options.pollInterval ?? 30_000;
    this.#settledInterval = options.settledInterval ?? 10 * 60_000;
    this.#batchSize = options.batchSize ?? 100;
    if (!(this.#pollInterval > 0) || !(this.#settledInterval >= 0)) {
      throw new RangeError('EquinixStatusUpdater: pollInterval must be > 0 ms and settledInterval >= 0 ms');
    }
    if (!Number.isSafeInteger(this.#batchSize) || this.#batchSize < 1) {
      throw new RangeError(`EquinixStatusUpdater: batchSize must be a positive integer, got ${this.#batchSize}`);
    }
  }

  /**
   * Runs passes every `pollInterval` until `signal` aborts, then closes its
   * session and resolves (the rules of `runRounds`). A failed pass is logged
   * and the next one tries again; an expired session is replaced.
   */
  async run(bmdb: BMDB, options: { readonly signal: AbortSignal }): Promise<void> {
    const { signal } = options;
    log.status('status updater for project %s started', this.#projectId);
    try {
      await runRounds(
        {
          signal,
          session: { bmdb, processor: STATUS_UPDATER_PROCESSOR },
          interval: this.#pollInterval,
          onFailure: (error, during) => {
            if (during === 'close') log.status('closing session failed: %s', describeError(error));
            else log.status('status pass for project %s failed: %s', this.#projectId, describeError(error));
          },
        },
        (session) => this.syncOnce(session, { signal: AbortSignal.any([signal, session.signal]) }),
      );
    } finally {
      log.status('status updater for project %s stopped', this.#projectId);
    }
  }

  /**
   * One pass. With `all`, every machine is checked, due or not.
   */
  async syncOnce(session: Session, options: { signal?: AbortSignal; all?: boolean } = {}): Promise<StatusSyncReport> {
    const { signal } = options;
    const machines = await session.transact((q) => providedMachines(q, EQUINIX_PROVIDER));
    const now = performance.now();
    this.#forgetGone(machines);
    const due = options.all ? machines : machines.filter((m) => (this.#nextCheck.get(m.providerId) ?? 0) <= now);
    if (due.length === 0) return { machines: machines.length, checked: 0, updated: 0, missing: 0, fetch: 'none' };

    const fetch = this.#listPages === undefined || due.length > this.#listPages ? 'list' : 'get';
    const seen = await this.#observe(due, fetch, signal);

    const updates: Array<{ machine: ProvidedMachine; update: ProviderStatusUpdate }> = [];
    let missing = 0;
    for (const machine of due) {
      const device = seen.get(machine.providerId);
      if (device === undefined) continue; // Not fetched this time: still due.
      if (device === 'missing') missing++;
      const update = changes(
        machine,
        device === 'missing' ? { providerStatus: ProviderStatus.Missing } : deviceFacts(device),
      );
      if (update) updates.push({ machine, update });
      if (settled(device)) this.#nextCheck.set(machine.providerId, now + this.#settledInterval);
      else this.#nextCheck.delete(machine.providerId);
    }
    for (let i = 0; i < updates.length; i += this.#batchSize) {
      const batch = updates.slice(i, i + this.#batchSize);
      await session.transact(async (q) => {
        for (const { machine, update } of batch)
          await updateProviderStatus(q, EQUINIX_PROVIDER, machine.providerId, update);
      });
      for (const { machine, update } of batch) {
        log.status(
          'machine %s (device %s): %s',
          machine.machineId,
          machine.providerId,
          describeUpdate(machine, update),
        );
      }
    }
    return { machines: machines.length, checked: seen.size, updated: updates.length, missing, fetch };
  }

  /** The devices of `due`, by provider ID; `missing` for a 404; absent when fetching failed. */
  async #observe(
    due: readonly ProvidedMachine[],
    fetch: 'list' | 'get',
    signal: AbortSignal | undefined,
  ): Promise<Map<string, EquinixDevice | 'missing'>> {
    const seen = new Map<string, EquinixDevice | 'missing'>();
    if (fetch === 'list') {
      const devices = await this.#client.listDevices(this.#projectId, {}, signal);
      this.#listPages = Math.max(1, Math.ceil(devices.length / this.#client.settings.pageSize));
      const wanted = new Set(due.map((machine) => machine.providerId));
      for (const device of devices) if (wanted.has(device.id)) seen.set(device.id, device);
    }
    // Not in the listing: deleted, or moved out of the project. Only a GET tells.
    await Promise.all(
      due
        .filter((machine) => !seen.has(machine.providerId))
        .map(async ({ providerId, machineId }) => {
          try {
            seen.set(providerId, await this.#client.getDevice(providerId, signal));
          } catch (error) {
            if (isAbortOf(error, signal)) throw error;
            if (error instanceof EquinixApiError && error.status === 404) seen.set(providerId, 'missing');
            else log.status('machine %s (device %s): check failed: %s', machineId, providerId, describeError(error));
          }
        }),
    );
    return seen;
  }

  /** Drops schedule entries of machines no longer in the BMDB. */
  #forgetGone(machines: readonly ProvidedMachine[]): void {
    const present = new Set(machines.map((machine) => machine.providerId));
    for (const id of [...this.#nextCheck.keys()]) if (!present.has(id)) this.#nextCheck.delete(id);
  }
}

/** Whether the device's facts will stay as they are until someone acts on it. */
function settled(device: EquinixDevice | 'missing'): boolean {
  if (device === 'missing') return true;
  if (!STABLE_STATES.has(device.state)) return false;
  return device.state === 'failed' || device.state === 'deleted' || deviceAddress(device) !== undefined;
}

/** The fields of `facts` that differ from what the BMDB holds, or `undefined` if none do. */
function changes(machine: ProvidedMachine, facts: ProviderStatusUpdate): ProviderStatusUpdate | undefined {
  const update: Record<string, unknown> = {};
  const pairs = [
    ['providerStatus', machine.providerStatus],
    ['providerIpAddress', machine.providerIpAddress],
    ['providerLocation', machine.providerLocation],
    ['providerReservationId', machine.providerReservationId],
  ] as const;
  for (const [key, current] of pairs) {
    const next = facts[key];
    if (next !== undefined && next !== current) update[key] = next;
  }
  return Object.keys(update).length > 0 ? (update as ProviderStatusUpdate) : undefined;
}

function describeUpdate(machine: ProvidedMachine, update: ProviderStatusUpdate): string {
  const parts: string[] = [];
  if (update.providerStatus !== undefined)
    parts.push(`status ${machine.providerStatus ?? '-'} -> ${update.providerStatus}`);
  if (update.providerIpAddress !== undefined) parts.push(`address ${update.providerIpAddress ?? '-'}`);
  if (update.providerLocation !== undefined) parts.push(`location ${update.providerLocation ?? '-'}`);
  if (update.providerReservationId !== undefined) parts.push(`reservation ${update.providerReservationId ?? '-'}`);
  return parts.join(', ');
}
