import { type BMDB, parseLimiter, type RateLimiter, runRounds } from '@bmaas/bmdb-controlloop';
import { leasePowerReads, type PowerReadLease, type PowerReadResult, recordPowerRead } from '@bmaas/bmdb-model';
import { describeError, sleep } from '@bmaas/common';
import { detail, log } from './internal.js';
import type { PowerControl } from './power.js';

/** Options of the {@link PowerSync}. Durations in milliseconds. */
export interface PowerSyncOptions {
  /** Paces reads across the fleet (`--power-sync-rate`). Default `100ms,10`: at most 10 a second. */
  readonly limiter?: RateLimiter | undefined;
  /** Most reads in flight at once (`--power-sync-concurrency`). Default 4. */
  readonly concurrency?: number | undefined;
  /**
   * A machine is read again at most this often (`--power-sync-interval`);
   * machines never read, and those a power action acted on, come first.
   * Default 1 min.
   */
  readonly interval?: number | undefined;
  /** How long an idle reader waits before it looks for a machine due again. Default the interval, at most 5 s. */
  readonly idlePoll?: number | undefined;
}

/**
 * Reads every provided machine's power state through the provider's
 * {@link PowerControl}, at a bounded rate and concurrency, and records it in
 * the BMDB with the time read, or the provider's failure with its cause (the
 * state read before stays). Machines are taken up never read first, then
 * oldest read first, each at most once per `interval`; several shepherd
 * processes share the work without reading a machine twice
 * (`leasePowerReads`).
 *
 * A read acts on nothing, so held machines are read too. It takes no claim:
 * it never keeps a power action or a recovery out. A read that a power
 * action or a newer read overtook (a state recorded after it began) is not
 * recorded.
 */
export class PowerSync {
  readonly #limiter: RateLimiter;
  readonly #concurrency: number;
  readonly #interval: number;
  readonly #idlePoll: number;

  constructor(
    private readonly power: PowerControl,
    options: PowerSyncOptions = {},
  ) {
    this.#limiter = options.limiter ?? parseLimiter('100ms,10');
    this.#concurrency = options.concurrency ?? 4;
    this.#interval = options.interval ?? 60_000;
    this.#idlePoll = options.idlePoll ?? Math.min(this.#interval, 5_000);
    if (!Number.isSafeInteger(this.#concurrency) || this.#concurrency < 1) {
      throw new RangeError(`power sync concurrency must be a whole number >= 1, got ${this.#concurrency}`);
    }
    if (!(this.#interval >= 0) || !Number.isFinite(this.#interval)) {
      throw new RangeError(`power sync interval must be a duration >= 0 ms, got ${this.#interval}`);
    }
    if (!(this.#idlePoll > 0)) throw new RangeError(`power sync idle poll must be > 0 ms, got ${this.#idlePoll}`);
  }

  /**
   * Reads until `signal` aborts, `concurrency` readers each paced by the
   * limiter (the rules of `runRounds`, without a session: a read claims
   * nothing); reads under way are abandoned (their results not recorded).
   */
  async run(bmdb: BMDB, options: { readonly signal: AbortSignal }): Promise<void> {
    const { signal } = options;
    log.power('power sync for provider %s started (%d reader(s))', this.power.type, this.#concurrency);
    const reader = () =>
      runRounds(
        {
          signal,
          before: (stop) => this.#limiter.wait(stop),
          onFailure: (error) => log.power('power sync for provider %s: %s', this.power.type, describeError(error)),
        },
        async () => {
          if ((await this.syncOne(bmdb, signal)) === undefined) await sleep(this.#idlePoll, signal);
        },
      );
    await Promise.all(Array.from({ length: this.#concurrency }, reader));
    log.power('power sync for provider %s stopped', this.power.type);
  }

  /**
   * Takes up one machine due for a read, reads and records it. Resolves
   * with the lease and what was read, or `undefined` when no machine is due.
   */
  async syncOne(
    bmdb: BMDB,
    signal?: AbortSignal,
  ): Promise<{ readonly lease: PowerReadLease; readonly result: PowerReadResult } | undefined> {
    const q = bmdb.db;
    const [lease] = await leasePowerReads(q, {
      provider: this.power.type,
      limit: 1,
      intervalSeconds: this.#interval / 1000,
    });
    if (lease === undefined) return undefined;
    let result: PowerReadResult;
    try {
      result = { state: await this.power.readPowerState(lease.providerId, signal) };
    } catch (error) {
      if (signal?.aborted) throw error;
      result = { failure: describeError(error) };
    }
    const before = await recordPowerRead(q, lease, result);
    const machine = `machine ${lease.machineId} (provider ID ${lease.providerId})`;
    if (before === undefined) {
      detail.power('%s: read overtaken by a power action or a newer read; not recorded', machine);
    } else if ('failure' in result) {
      // Each new cause once, not every read of a BMC that stays down.
      (before.failedCause === result.failure ? detail.power : log.power)(
        '%s: power state read failed: %s',
        machine,
        result.failure,
      );
    } else if (before.state !== result.state) {
      log.power('%s: power %s -> %s', machine, before.state ?? 'never read', result.state);
    } else {
      detail.power('%s: power %s', machine, result.state);
    }
    return { lease, result };
  }
}
