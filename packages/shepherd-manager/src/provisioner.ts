import {
  type BMDB,
  parseLimiter,
  type RateLimiter,
  runRounds,
  type Session,
  SessionClosedError,
  SessionExpiredError,
} from '@bmaas/bmdb-controlloop';
import {
  type AgentBootMethod,
  forgetUnlistedRetiredMachines,
  type ProvidedMachine,
  ProviderStatus,
  providedMachines,
  retiredProviderIds,
  setAgentBootMethods,
} from '@bmaas/bmdb-model';
import { describeError, isStop } from '@bmaas/common';
import { detail, log } from './internal.js';
import { Availability, type Machine, type Provider, ShepherdError } from './provider.js';

/** Options of the {@link Provisioner}. */
export interface ProvisionerOptions {
  /**
   * Most machines to manage; 0 for no limit. The provisioner never reduces
   * the count. Default 50.
   */
  readonly maxCount?: number;
  /** Paces reconciliation passes. Default `1m,1`. */
  readonly reconcileLimiter?: RateLimiter;
  /** Paces machine creation, across passes. Default `5s,1`. */
  readonly creationLimiter?: RateLimiter;
  /**
   * Most machines created in one pass, so the discrepancy check runs often
   * while a large fleet comes up. Default 20.
   */
  readonly chunkSize?: number;
}

/**
 * The provider and the BMDB disagree about which machines we manage, so badly
 * that acting could lose or duplicate machines. The provisioner refuses to
 * create anything until an operator resolves it.
 */
export class ProviderDiscrepancyError extends ShepherdError {
  override name = 'ProviderDiscrepancyError';
  constructor(
    readonly provider: string,
    /** Provider IDs the provider uses for us that the BMDB does not know. */
    readonly missingFromBMDB: readonly string[],
    /** Provider IDs in the BMDB that the provider does not list. */
    readonly missingFromProvider: readonly string[],
  ) {
    const parts: string[] = [];
    if (missingFromBMDB.length) parts.push(`in use at the provider but not in the BMDB: ${missingFromBMDB.join(', ')}`);
    if (missingFromProvider.length) {
      parts.push(`in the BMDB but not listed by the provider: ${missingFromProvider.join(', ')}`);
    }
    // The way out of the second kind: machines gone for good leave the BMDB by decommissioning.
    const wayOut = missingFromProvider.length
      ? `; if they are gone for good, remove them from the BMDB with \`shepherd decommission --provider ${provider} --provider-id ${missingFromProvider.join(' ')}\``
      : '';
    super(`provider ${provider} and the BMDB disagree, refusing to provision; machines ${parts.join('; ')}${wayOut}`);
  }
}

/** What one reconciliation pass saw and did. */
export interface ReconcileReport {
  /** Machines both in use at the provider and in the BMDB. */
  readonly managed: number;
  /** Unused capacity the provider offered. */
  readonly available: number;
  /** Provider IDs of machines created in this pass. */
  readonly created: readonly string[];
  /** Machines whose creation failed in this pass, with the reason. */
  readonly failed: readonly { readonly machine: Machine; readonly error: unknown }[];
  /** Machines whose boot method (`Machine.agentBoot`) the BMDB took from the provider in this pass. */
  readonly bootMethodsChanged: number;
  /** Provider IDs the provider lists that are retired (decommissioned), so not brought in, sorted. */
  readonly retired: readonly string[];
  /** Retired machines forgotten in this pass, sorted: the provider lists them no more. */
  readonly forgotten: readonly string[];
}

const PROCESSOR = 'shepherd-provisioner';

/**
 * Brings machines in from a provider, up to a limit: each pass lists the
 * provider's machines and the BMDB's in parallel, records the boot method of
 * each machine in use in the BMDB (so the BMDB follows the inventory), checks
 * they agree, and creates machines from unused capacity. It claims no work:
 * creation is the provider's, recorded in the BMDB in the same step.
 *
 * A retired machine (decommissioned) the provider still lists is neither
 * capacity nor missing from the BMDB: it is left out until an operator
 * recommissions it; once the provider lists it no more (in a pass in which
 * the provider and the BMDB agree), its retirement is forgotten, so an entry
 * added again under its ID is a new machine.
 */
export class Provisioner {
  readonly #maxCount: number;
  readonly #chunkSize: number;
  readonly #reconcileLimiter: RateLimiter;
  readonly #creationLimiter: RateLimiter;

  constructor(
    private readonly provider: Provider,
    options: ProvisionerOptions = {},
  ) {
    const maxCount = options.maxCount ?? 50;
    const chunkSize = options.chunkSize ?? 20;
    if (!Number.isSafeInteger(maxCount) || maxCount < 0) {
      throw new RangeError(`provisioner maxCount must be a whole number >= 0 (0: no limit), got ${maxCount}`);
    }
    if (!Number.isSafeInteger(chunkSize) || chunkSize < 1) {
      throw new RangeError(`provisioner chunkSize must be a whole number >= 1, got ${chunkSize}`);
    }
    this.#maxCount = maxCount;
    this.#chunkSize = chunkSize;
    this.#reconcileLimiter = options.reconcileLimiter ?? parseLimiter('1m,1');
    this.#creationLimiter = options.creationLimiter ?? parseLimiter('5s,1');
  }

  /**
   * Reconciles, paced by the reconcile limiter, until `signal` aborts; then
   * closes its session (the rules of `runRounds`). A failed pass (including
   * a refusal) is logged and the next one tried; an expired session is
   * replaced.
   */
  async run(bmdb: BMDB, options: { signal: AbortSignal }): Promise<void> {
    const { signal } = options;
    await runRounds(
      {
        signal,
        session: { bmdb, processor: PROCESSOR },
        before: (stop) => this.#reconcileLimiter.wait(stop),
        onFailure: (error, during) => {
          if (during === 'close') log.provisioner('closing session failed: %s', describeError(error));
          else if (error instanceof SessionExpiredError || error instanceof SessionClosedError) {
            log.provisioner('%s; starting a new session', error.message);
          } else log.provisioner('reconciliation failed: %s', describeError(error));
        },
      },
      (session) => this.reconcile(session, signal),
    );
  }

  /**
   * One reconciliation pass.
   *
   * @throws {@link ProviderDiscrepancyError} when the provider and the BMDB
   *   disagree; nothing is created then
   */
  async reconcile(session: Session, signal?: AbortSignal): Promise<ReconcileReport> {
    const type = this.provider.type;
    const listing = new AbortController();
    const listingSignal = signal ? AbortSignal.any([signal, listing.signal]) : listing.signal;
    let listed: Machine[];
    let provided: ProvidedMachine[];
    let retiredIds: Set<string>;
    try {
      // In parallel; the first failure cancels the provider listing.
      [listed, [provided, retiredIds]] = await Promise.all([
        this.provider.listMachines(listingSignal),
        session.transact(async (q) => [await providedMachines(q, type), await retiredProviderIds(q, type)] as const),
      ]);
    } catch (error) {
      listing.abort(error);
      throw error;
    }
    const inBMDB = new Set(provided.map((m) => m.providerId));
    // A machine the BMDB has is managed even if retired under its ID (brought back by hand, say).
    const retired = (machine: Machine) =>
      machine.id !== undefined && retiredIds.has(machine.id) && !inBMDB.has(machine.id);
    const retiredListed = listed.filter(retired).map((m) => m.id as string);
    if (retiredListed.length > 0) {
      detail.provisioner('%s lists %d retired machine(s), left out: %s', type, retiredListed.length, retiredListed);
    }
    const inProvider = listed.filter((machine) => !retired(machine));
    // A machine whose provisioning failed for good may well be gone at the provider.
    const failedInBMDB = new Set(
      provided.filter((m) => m.providerStatus === ProviderStatus.ProvisioningFailedPermanent).map((m) => m.providerId),
    );
    detail.provisioner('%s lists %d machine(s), the BMDB %d', type, inProvider.length, inBMDB.size);

    const available: Machine[] = [];
    const used = new Map<string, Machine>();
    for (const machine of inProvider) {
      const availability = resolvePossiblyUsed(machine, inBMDB);
      if (availability === Availability.KnownUnused) {
        // A failed machine is no capacity: creating or adopting it would fail every pass.
        if (!machine.failed) available.push(machine);
      } else if (machine.id !== undefined) used.set(machine.id, machine);
      else
        throw new ShepherdError(`provider ${type} listed a machine in use without an ID (address ${machine.address})`);
    }

    // Before the agreement check: a machine both know boots as its inventory says, whatever else disagrees.
    const bootMethods = new Map(
      [...used.values()].filter((m) => inBMDB.has(m.id as string)).map((m) => [m.id as string, m.agentBoot]),
    );
    let bootMethodsChanged = await this.#recordBootMethods(session, bootMethods);

    const missingFromBMDB = [...used.values()].filter((m) => !inBMDB.has(m.id as string) && !m.failed).map((m) => m.id);
    const missingFromProvider = [...inBMDB].filter((id) => !used.has(id) && !failedInBMDB.has(id));
    if (missingFromBMDB.length > 0 || missingFromProvider.length > 0) {
      throw new ProviderDiscrepancyError(type, missingFromBMDB as string[], missingFromProvider.sort());
    }
    // Only once they agree: a listing that lost machines (an inventory served empty) must not forget retirements.
    const forgotten = await this.#forgetUnlisted(session, listed, retiredIds);

    const managed = [...used.keys()].filter((id) => inBMDB.has(id)).length;
    const wanted = this.#maxCount === 0 ? Number.POSITIVE_INFINITY : this.#maxCount - managed;
    const toCreate = available.slice(0, Math.max(0, Math.min(wanted, this.#chunkSize)));
    // Worth a line only when it leads to something.
    (toCreate.length > 0 ? log.provisioner : detail.provisioner)(
      '%d managed (limit %s), %d available, creating %d',
      managed,
      this.#maxCount === 0 ? 'none' : this.#maxCount,
      available.length,
      toCreate.length,
    );

    const created: string[] = [];
    const failed: { machine: Machine; error: unknown }[] = [];
    for (const machine of toCreate) {
      await this.#creationLimiter.wait(signal);
      // A provider takes the machine before it records it through the session (and may wrap the
      // session's error in its own): once the session is gone, each creation would leave a machine
      // the BMDB never hears of.
      const state = session.state;
      if (state === 'closed') throw new SessionClosedError(session.id);
      if (state === 'expired') throw new SessionExpiredError(session.id, 'during a provisioning pass');
      try {
        const result = await this.provider.createMachine(session, { unusedMachine: machine }, signal);
        log.provisioner('provided machine %s at %s (%s)', result.id, type, result.address ?? 'no address yet');
        created.push(result.id ?? '');
        // At once, not next pass: a new machine booted by its BMC must not be offered to the SSH initializer meanwhile.
        if (result.id !== undefined && result.agentBoot !== 'ssh') {
          bootMethodsChanged += await this.#recordBootMethods(session, new Map([[result.id, result.agentBoot]]));
        }
      } catch (error) {
        if (isStop(error, signal) || error instanceof SessionExpiredError) throw error;
        // One failed creation must not stop the others.
        log.provisioner('creating machine %s at %s failed: %s', machine.id ?? '(new)', type, describeError(error));
        failed.push({ machine, error });
      }
    }
    return {
      managed,
      available: available.length,
      created,
      failed,
      bootMethodsChanged,
      retired: [...new Set(retiredListed)].sort(),
      forgotten,
    };
  }

  /** Forgets the retired machines `inProvider` lists no more; logs them. */
  async #forgetUnlisted(
    session: Session,
    inProvider: readonly Machine[],
    retiredIds: ReadonlySet<string>,
  ): Promise<string[]> {
    const listed = new Set(inProvider.flatMap((m) => (m.id === undefined ? [] : [m.id])));
    if (![...retiredIds].some((id) => !listed.has(id))) return [];
    const type = this.provider.type;
    const forgotten = await session.transact((q) => forgetUnlistedRetiredMachines(q, type, [...listed]));
    for (const id of forgotten) {
      log.provisioner('forgot retired machine %s of %s: the provider lists it no more', id, type);
    }
    return forgotten;
  }

  /** `setAgentBootMethods`, one statement that writes only what changed; logs a change. */
  async #recordBootMethods(session: Session, methods: ReadonlyMap<string, AgentBootMethod>): Promise<number> {
    const type = this.provider.type;
    const changed = await session.transact((q) => setAgentBootMethods(q, type, methods));
    if (changed > 0)
      log.provisioner('%d machine(s) of %s changed boot method (ssh, virtual-media, network)', changed, type);
    return changed;
  }
}

/**
 * A machine's availability once `PossiblyUsed` is settled against the BMDB:
 * without an ID, or absent from the BMDB, it is unused; present, it is used.
 * Other availabilities are returned unchanged.
 *
 * @param inBMDB - provider IDs the BMDB has for this provider
 */
export function resolvePossiblyUsed(machine: Machine, inBMDB: ReadonlySet<string>): Availability {
  if (machine.availability !== Availability.PossiblyUsed) return machine.availability;
  if (machine.id === undefined || machine.id === '') return Availability.KnownUnused;
  return inBMDB.has(machine.id) ? Availability.KnownUsed : Availability.KnownUnused;
}
