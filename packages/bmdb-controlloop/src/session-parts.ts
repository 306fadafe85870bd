import type { Kysely } from 'kysely';
import type pg from 'pg';
import type { Ends } from './internal/ends.js';
import type { SelectionClaims } from './internal/selection-claims.js';
import type { BMDBMetrics } from './metrics.js';
import type { Database } from './schema.js';

/**
 * @internal What the sessions of one BMDB connection, and their work, go
 * through: the connection's own parts, one set shared by all its sessions.
 */
export interface SessionParts {
  readonly db: Kysely<Database>;
  /** Claims from selections, batched across sessions (one statement at READ COMMITTED; see sql/claim.ts). */
  readonly claims: SelectionClaims;
  /** Ends of work without a caller's transaction, batched across sessions. */
  readonly ends: Ends;
  /** A small pool of its own, so heartbeats never queue behind work. */
  readonly heartbeatPool: pg.Pool;
  readonly metrics: BMDBMetrics | undefined;
}
