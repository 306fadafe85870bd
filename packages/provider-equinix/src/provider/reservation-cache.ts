import { performance } from 'node:perf_hooks';
import type { EquinixHardwareReservation } from '../api/types.js';

type Load = (signal: AbortSignal | undefined) => Promise<EquinixHardwareReservation[]>;

/**
 * The project's hardware reservations, listed at most once per `ttl`:
 * listing them is the API's slowest call. Concurrent readers share one
 * listing. {@link ReservationCache.invalidate} forgets the list (we just took
 * or failed to take a reservation), and a listing that was under way when it
 * was called is not kept.
 */
export class ReservationCache {
  #cached: { reservations: readonly EquinixHardwareReservation[]; at: number } | undefined;
  #loading: Promise<readonly EquinixHardwareReservation[]> | undefined;
  #generation = 0;
  /** Every reservation of the latest listing, kept across invalidations: plans do not change. */
  #lastKnown = new Map<string, EquinixHardwareReservation>();

  constructor(
    private readonly load: Load,
    /** How long a listing stays fresh, in milliseconds. */
    readonly ttl: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** The reservations, from the cache while fresh. A listing is shared: the first caller's signal can abort it. */
  get(signal?: AbortSignal): Promise<readonly EquinixHardwareReservation[]> {
    const cached = this.#cached;
    if (cached && this.now() - cached.at < this.ttl) return Promise.resolve(cached.reservations);
    if (this.#loading) return this.#loading;
    const generation = this.#generation;
    const loading = this.load(signal)
      .then((reservations) => {
        if (generation === this.#generation) this.#cached = { reservations, at: this.now() };
        this.#lastKnown = new Map(reservations.map((reservation) => [reservation.id, reservation]));
        return reservations;
      })
      .finally(() => {
        if (this.#loading === loading) this.#loading = undefined;
      });
    this.#loading = loading;
    return loading;
  }

  /**
   * A reservation as the latest listing showed it, even if the cache has
   * since been invalidated or expired: for its plan and facility, which do not
   * change, not for whether it is free.
   */
  lastKnown(id: string): EquinixHardwareReservation | undefined {
    return this.#lastKnown.get(id);
  }

  invalidate(): void {
    this.#generation++;
    this.#cached = undefined;
    this.#loading = undefined;
  }
}
