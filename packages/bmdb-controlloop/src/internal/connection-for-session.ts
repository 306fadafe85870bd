import type { Kysely } from 'kysely';
import type pg from 'pg';
import type { BMDBMetrics } from '../metrics.js';
import type { Database } from '../schema.js';
import type { MachineChanges } from './changes.js';
import type { Ends } from './ends.js';
import type { RunStatement } from './retry.js';
import type { SelectionClaims } from './selection-claims.js';
import type { SessionConnection } from './session-connection.js';

/** The connection as its sessions see it: its pools, batched claims and ends, and metrics. */
export class ConnectionForSession implements SessionConnection {
  constructor(
    readonly db: Kysely<Database>,
    readonly claims: SelectionClaims,
    readonly ends: Ends,
    readonly changes: MachineChanges,
    readonly heartbeatPool: pg.Pool,
    readonly metrics: BMDBMetrics | undefined,
    private readonly runBatch: RunStatement,
    private readonly onSessionEnded: (sessionId: string) => void,
  ) {}

  retry<T>(processor: string, attempt: () => Promise<T>): Promise<T> {
    return this.runBatch([processor], attempt);
  }

  sessionEnded(sessionId: string): void {
    this.onSessionEnded(sessionId);
  }
}
