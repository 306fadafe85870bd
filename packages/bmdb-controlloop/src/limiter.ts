import { sleep } from '@bmaas/common';
import { TokenBucket } from 'limiter';
import { formatDuration, parseDuration } from './duration.js';
import { InvalidSettingError } from './errors.js';

const SYNTAX = "'duration,count', e.g. '250ms,8' for a bucket of 8 tokens refilled one token every 250ms";

/**
 * A token-bucket rate limiter: a bucket of `burst` tokens, refilled one token
 * every `every` milliseconds, full at start (like Go's `rate.NewLimiter`).
 *
 * @example
 * ```ts
 * const limiter = parseLimiter('250ms,8');
 * await limiter.wait(signal); // at most 8 at once, then 4 per second
 * ```
 */
export class RateLimiter {
  readonly #bucket: TokenBucket;

  /**
   * @param every - milliseconds between two refilled tokens (> 0)
   * @param burst - size of the bucket (a positive integer)
   */
  constructor(
    readonly every: number,
    readonly burst: number,
  ) {
    if (!(every > 0) || !Number.isFinite(every)) {
      throw new RangeError(`rate limiter refill interval must be a positive duration, got ${every}ms`);
    }
    if (!Number.isSafeInteger(burst) || burst < 1) {
      throw new RangeError(`rate limiter bucket size must be a positive integer, got ${burst}`);
    }
    this.#bucket = new TokenBucket({ bucketSize: burst, tokensPerInterval: 1, interval: every });
    // limiter's buckets start empty; Go's start full, and so do ours.
    this.#bucket.content = burst;
  }

  /** The limiter in flag syntax, e.g. `250ms,8`. */
  get spec(): string {
    return `${formatDuration(this.every)},${this.burst}`;
  }

  /** Takes a token if one is available right now. */
  tryTake(): boolean {
    return this.#bucket.tryRemoveTokens(1);
  }

  /**
   * Waits for a token and takes it. Rejects with the signal's reason as soon
   * as `signal` aborts; no token is taken then.
   */
  async wait(signal?: AbortSignal): Promise<void> {
    // limiter's own removeTokens cannot be aborted, so poll its bucket and
    // sleep exactly as long as it says the next token needs.
    while (!this.tryTake()) {
      await sleep(Math.max(1, this.#bucket.getWaitTime(1)), signal);
    }
  }
}

/**
 * Creates a {@link RateLimiter} from the shepherd's flag syntax
 * `'duration,count'`: `'250ms,8'` is a bucket of 8 refilled one token every
 * 250 ms; durations use Go units (`ms`, `s`, `m`, `h`).
 *
 * @throws {@link InvalidSettingError} naming the value and the expected syntax.
 */
export function parseLimiter(spec: string): RateLimiter {
  const parts = spec.split(',');
  if (parts.length !== 2) throw new InvalidSettingError(spec, SYNTAX);
  const [durationText, countText] = parts as [string, string];
  let every: number;
  try {
    every = parseDuration(durationText);
  } catch {
    throw new InvalidSettingError(spec, `${SYNTAX}; ${JSON.stringify(durationText)} is not a duration`);
  }
  if (every <= 0) {
    throw new InvalidSettingError(spec, `${SYNTAX}; the duration must be greater than zero`);
  }
  const count = countText.trim();
  if (!/^\d+$/.test(count) || Number(count) < 1 || Number(count) > 2 ** 31 - 1) {
    throw new InvalidSettingError(
      spec,
      `${SYNTAX}; ${JSON.stringify(countText)} is not a count between 1 and 2147483647`,
    );
  }
  return new RateLimiter(every, Number(count));
}
