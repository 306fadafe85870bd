import type { BMDBMetrics } from '../metrics.js';
import type { RetryHooks } from './retry.js';

/**
 * How `withRetry` counts a statement or transaction in the BMDB's metrics:
 * once for each processor (session label) it serves, as a batch is one
 * transaction for every session in it.
 */
export function retryMetrics(metrics: BMDBMetrics | undefined, processors: readonly string[]): RetryHooks {
  return {
    onAttempt: () => {
      for (const processor of processors) metrics?.transactionsExecuted.inc({ processor });
    },
    onRetry: () => {
      for (const processor of processors) metrics?.transactionsRetried.inc({ processor });
    },
    onFailure: () => {
      for (const processor of processors) metrics?.transactionsFailed.inc({ processor });
    },
    onConnectionLoss: (cause) => {
      for (const processor of processors) metrics?.connectionLost.inc({ processor, cause });
    },
  };
}
