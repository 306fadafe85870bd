import type { Kysely, RawBuilder } from 'kysely';
import type { WorkOutcome } from '../errors.js';
import type { Database } from '../schema.js';
import type { Work } from '../work.js';
import type { ReleaseRequest } from './releases.js';

/** What a {@link Work} needs from the session that holds it. */
export interface SessionRuntime {
  readonly sessionId: string;
  /** Throws SessionExpiredError / SessionClosedError unless the session is live. */
  assertLive(): void;
  /** Aborts when the session expires or closes. */
  readonly signal: AbortSignal;
  /**
   * Whether the session's row is alive in the database right now; `undefined`
   * when the database cannot be reached to tell.
   */
  aliveInDatabase(): Promise<boolean | undefined>;
  /** A retried transaction at the connection's isolation level. */
  transaction<T>(fn: (trx: Kysely<Database>) => Promise<T>): Promise<T>;
  /**
   * A retried transaction whose first statement, values inlined, is sent in
   * one round trip with its `BEGIN`.
   */
  transactionOpenedBy<T>(opening: RawBuilder<unknown>, fn: (trx: Kysely<Database>) => Promise<T>): Promise<T>;
  /**
   * Ends a work item of this session in the next batch of releases; resolves
   * false if the session no longer held the claim.
   */
  release(request: Omit<ReleaseRequest, 'sessionId' | 'processor'>): Promise<boolean>;
  /** Bookkeeping once a work item ended. */
  workEnded(work: Work, outcome: WorkOutcome): void;
}
