import type { BatcherOptions } from './batcher.js';
import { isConnectionLost } from './connection-lost.js';

/**
 * How the BMDB's batched writes share a statement, each request writing one
 * machine's rows: a batch holds at most one request per machine, so that
 * its writes never meet on a row; and a batch that failed for anything but
 * a lost connection (one request's bad value, say a time PostgreSQL cannot
 * store) is sent again request by request, so that it fails only that one.
 */
export function onePerMachine<I extends { readonly machineId: string }>(): Pick<
  BatcherOptions<I, unknown>,
  'admits' | 'isolates'
> {
  return {
    admits: (batch, item) => !batch.some((other) => other.machineId === item.machineId),
    isolates: (error) => !isConnectionLost(error),
  };
}
