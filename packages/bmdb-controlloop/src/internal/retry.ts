import { retry } from '@bmaas/common';
import { type ConnectionLoss, connectionLoss, describeConnectionLoss, isNotExecuted } from './connection-lost.js';
import { detail, log } from './log.js';

/** SQLSTATEs after which the whole transaction can simply run again. */
const RETRYABLE = new Set(['40001', '40P01']);

/** Whether a database error is a serialization failure or a deadlock. */
export function isRetryable(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && RETRYABLE.has(code);
}

export interface RetryHooks {
  onAttempt(): void;
  onRetry(error: unknown, attempt: number): void;
  onFailure(error: unknown): void;
  /** An attempt failed for a lost connection or a node that is not the primary (retried or not). */
  onConnectionLoss(loss: ConnectionLoss): void;
}

/** Enough for heavy contention; each wait is short and jittered. */
const MAX_ATTEMPTS = 30;

/**
 * Runs `attempt` until it succeeds, retrying serialization failures and
 * deadlocks, and the failover errors after which nothing ran (a read-only
 * node, a server starting up), with `@bmaas/common`'s jittered exponential
 * pause (5 ms doubling to 500 ms, so about 12 s in all). The failed attempt's
 * connection is not reused (the pools drop a connection whose query
 * failed), so the next goes to whichever node HAProxy routes to now. A
 * connection lost mid-statement is not retried here: whether it committed
 * is unknown, and the callers decide (an end is made again, a claim gives
 * its session up). What this adds to `retry` is the library's: which
 * database errors are retried, and the metrics and logs of each attempt.
 */
export async function withRetry<T>(attempt: () => Promise<T>, hooks: RetryHooks): Promise<T> {
  try {
    return await retry(
      async () => {
        hooks.onAttempt();
        try {
          return await attempt();
        } catch (error) {
          const loss = connectionLoss(error);
          if (loss) hooks.onConnectionLoss(loss);
          throw error;
        }
      },
      {
        maxAttempts: MAX_ATTEMPTS,
        baseDelay: 5,
        maxDelay: 500,
        retryable: (error) => isRetryable(error) || isNotExecuted(connectionLoss(error)),
        onRetry: (error, n) => {
          hooks.onRetry(error, n);
          const loss = connectionLoss(error);
          if (loss) log.connection('%s; retrying on a fresh connection (attempt %d)', describeConnectionLoss(loss), n);
          else detail.connection('retrying transaction after %s (attempt %d)', (error as { code?: string }).code, n);
        },
      },
    );
  } catch (error) {
    hooks.onFailure(error);
    throw error;
  }
}
