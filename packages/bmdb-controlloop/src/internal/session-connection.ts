import type { Kysely } from 'kysely';
import type pg from 'pg';
import type { BMDBMetrics } from '../metrics.js';
import type { Database } from '../schema.js';
import type { MachineChanges } from './changes.js';
import type { Ends } from './ends.js';
import type { SelectionClaims } from './selection-claims.js';

/**
 * What a `Session` needs from the BMDB connection that started it: the
 * port the connection implements (`ConnectionForSession` in internal/connection-for-session.ts).
 */
export interface SessionConnection {
  readonly db: Kysely<Database>;
  /** Claims from selections, batched across sessions (one statement at READ COMMITTED; see sql/claim-selected.ts). */
  readonly claims: SelectionClaims;
  /** Ends of work without a caller's transaction, batched across sessions. */
  readonly ends: Ends;
  /** Wakes idle control loops when machines may have become eligible. */
  readonly changes: MachineChanges;
  /** A small pool of its own, so heartbeats never queue behind work. */
  readonly heartbeatPool: pg.Pool;
  readonly metrics: BMDBMetrics | undefined;
  /** Runs `attempt`, retrying serialization failures, with metrics for `processor`. */
  retry<T>(processor: string, attempt: () => Promise<T>): Promise<T>;
  /** The session `sessionId` ended (closed or expired). */
  sessionEnded(sessionId: string): void;
}
