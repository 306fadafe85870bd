/**
 * Keys that misbehaved, each kept out until its time is up (the original's
 * "sinbin"). Expired entries are dropped as they are looked at.
 */
export class PenaltyBox {
  readonly #until = new Map<string, number>();

  constructor(
    /** How long a key stays penalised, in milliseconds. */
    readonly duration: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Penalises `key` from now on; returns when the penalty ends (ms since the epoch, by `now`). */
  add(key: string): number {
    const until = this.now() + this.duration;
    this.#until.set(key, until);
    return until;
  }

  /** When `key`'s penalty ends, if it is penalised now. */
  until(key: string): number | undefined {
    const until = this.#until.get(key);
    if (until === undefined) return undefined;
    if (until > this.now()) return until;
    this.#until.delete(key);
    return undefined;
  }

  isPenalised(key: string): boolean {
    return this.until(key) !== undefined;
  }
}
