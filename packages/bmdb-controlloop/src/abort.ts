/**
 * Telling a stop from a failure. Two questions with two answers: was it the
 * caller's own signal ({@link isAbortOf}), or did anything abort
 * ({@link isAbortError})?
 */

/**
 * Whether `error` is `signal`'s own abort reason: the caller stopped the
 * operation, nothing failed. False while `signal` has not aborted.
 */
export function isAbortOf(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && error === signal.reason;
}

/**
 * Whether `error` is an `AbortError`: some signal aborted the operation,
 * not necessarily the caller's (an `AbortSignal.timeout` gives a
 * `TimeoutError` instead, which this is not).
 */
export function isAbortError(error: unknown): boolean {
  return error instanceof Error && error.name === 'AbortError';
}
