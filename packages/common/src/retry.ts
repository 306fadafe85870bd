import { sleep } from './sleep.js';

/** How {@link retry} retries one operation. Durations in milliseconds. */
export interface RetryOptions {
  /** Attempts in all, the first included. */
  readonly maxAttempts: number;
  /** The pause before the first retry; it doubles with each further one. */
  readonly baseDelay: number;
  /** Longest pause the doubling reaches. Default: no bound. */
  readonly maxDelay?: number | undefined;
  /** Whether a failed attempt's error is worth another attempt; any other error is thrown at once. */
  readonly retryable: (error: unknown) => boolean;
  /**
   * The pause a failure asks for itself (an HTTP `Retry-After`), taken instead
   * of the backoff's; `undefined` keeps the backoff's.
   */
  readonly requestedPause?: ((error: unknown) => number | undefined) | undefined;
  /** Told of each retry before its pause: the error, the number of the attempt that failed (1 first) and the pause. */
  readonly onRetry?: ((error: unknown, attempt: number, pause: number) => void) | undefined;
  /** Stops the retries: a failure once it aborted, and the pause, throw its reason. */
  readonly signal?: AbortSignal | undefined;
}

/**
 * Runs `attempt` (given its number, 1 first) until it resolves, throws an
 * error that is not `retryable`, or `maxAttempts` were made (then the last
 * error is thrown). The pause before retry `n` is the backoff's: a ceiling of
 * `baseDelay · 2^(n-1)`, bounded by `maxDelay`, of which "equal jitter" takes
 * between half and all, so that many callers failing together do not come
 * back together.
 *
 * @example
 * ```ts
 * const body = await retry(() => fetchStatus(url), {
 *   maxAttempts: 5,
 *   baseDelay: 100,
 *   retryable: (error) => error instanceof NetworkError,
 *   signal,
 * });
 * ```
 */
export async function retry<T>(attempt: (attempt: number) => Promise<T>, options: RetryOptions): Promise<T> {
  const { signal } = options;
  for (let made = 1; ; made++) {
    try {
      return await attempt(made);
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      if (made >= options.maxAttempts || !options.retryable(error)) throw error;
      const pause = Math.round(options.requestedPause?.(error) ?? backoffPause(options, made));
      options.onRetry?.(error, made, pause);
      await sleep(pause, signal);
    }
  }
}

/** The backoff's pause after failed attempt `made`: exponential, bounded, with equal jitter. */
function backoffPause(options: RetryOptions, made: number): number {
  const ceiling = Math.min(options.maxDelay ?? Number.POSITIVE_INFINITY, options.baseDelay * 2 ** (made - 1));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}
