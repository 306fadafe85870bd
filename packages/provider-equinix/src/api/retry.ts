/**
 * How the client retries failed requests, through `@bmaas/common`'s `retry`
 * (jittered exponential backoff). Durations in milliseconds.
 */
export interface RetryPolicy {
  /** Attempts per request, the first included. Default 6. */
  readonly maxAttempts: number;
  /** Pause before the first retry; it doubles with each further retry. Default 1 s. */
  readonly baseDelay: number;
  /** Longest pause computed by the backoff. Default 30 s. */
  readonly maxDelay: number;
  /** Longest pause a `Retry-After` header can impose. Default 5 min. */
  readonly maxRetryAfter: number;
}

export const DEFAULT_RETRY_POLICY: RetryPolicy = {
  maxAttempts: 6,
  baseDelay: 1_000,
  maxDelay: 30_000,
  maxRetryAfter: 300_000,
};

/** Checks and completes a partial policy. */
export function retryPolicy(partial: Partial<RetryPolicy> = {}): RetryPolicy {
  const policy = { ...DEFAULT_RETRY_POLICY, ...partial };
  if (!Number.isSafeInteger(policy.maxAttempts) || policy.maxAttempts < 1) {
    throw new RangeError(`retry.maxAttempts must be a positive integer, got ${policy.maxAttempts}`);
  }
  for (const key of ['baseDelay', 'maxDelay', 'maxRetryAfter'] as const) {
    if (!(policy[key] >= 0) || !Number.isFinite(policy[key])) {
      throw new RangeError(`retry.${key} must be a duration >= 0 ms, got ${policy[key]}`);
    }
  }
  return policy;
}

/**
 * A `Retry-After` header in milliseconds: delta-seconds or an HTTP date.
 * `undefined` when absent or unreadable.
 */
export function parseRetryAfter(header: string | null, now: number = Date.now()): number | undefined {
  if (header === null) return undefined;
  const text = header.trim();
  if (/^\d+(\.\d+)?$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, date - now);
}
