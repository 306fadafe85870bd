/** Whether `error` is `signal`'s abort reason, i.e. the caller stopped us rather than a failure. */
export function isAbortOf(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && error === signal.reason;
}
