/**
 * Telling a stop from a failure: was it the caller's own signal
 * ({@link isAbortOf}), did anything abort ({@link isAbortError}), and, for a
 * loop deciding whether to go on, either ({@link isStop}).
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

/**
 * Whether `error` stops what `signal` runs rather than failing it: the
 * signal's own reason, any `AbortError`, or the `TimeoutError` of an
 * `AbortSignal.timeout`. The one test of the library's loops (the control
 * loop's workers, `runRounds`) and of the shepherd's.
 */
export function isStop(error: unknown, signal?: AbortSignal): boolean {
  return isAbortOf(error, signal) || isAbortError(error) || (error instanceof Error && error.name === 'TimeoutError');
}
