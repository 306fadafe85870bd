// Retries of a BMC request (Redfish or IPMI): the same policy for both protocols.

/** A failure worth another attempt (network errors, timeouts, 5xx): thrown by an attempt, carrying the failure to report. */
export class RetryableError<E extends Error = Error> extends Error {
  constructor(readonly failure: E) {
    super(failure.message);
  }
}

/**
 * Runs `attempt` until it resolves, throws anything but a
 * {@link RetryableError}, or `maxAttempts` were made (then its failure is
 * thrown). Pauses between attempts grow exponentially from `retryDelay`, with
 * "equal jitter" so that BMCs failing together are not all asked again
 * together; `onRetry` says each one (for the log) before it is taken.
 */
export async function withRetries<T>(
  policy: { readonly maxAttempts: number; readonly retryDelay: number },
  attempt: () => Promise<T>,
  onRetry: (failure: Error, next: number, pause: number) => void,
  signal: AbortSignal | undefined,
): Promise<T> {
  for (let made = 1; ; made++) {
    let failure: Error;
    try {
      return await attempt();
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      if (!(error instanceof RetryableError)) throw error;
      failure = error.failure;
    }
    if (made >= policy.maxAttempts) throw failure;
    const ceiling = policy.retryDelay * 2 ** (made - 1);
    const pause = ceiling / 2 + Math.random() * (ceiling / 2);
    onRetry(failure, made + 1, Math.round(pause));
    await sleep(pause, signal);
  }
}

import { sleep } from '@bmaas/common';
