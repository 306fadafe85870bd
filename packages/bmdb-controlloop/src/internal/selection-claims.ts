import { type Expression, type Kysely, type RawBuilder, sql } from 'kysely';
import { BMDBError } from '../errors.js';
import type { Database } from '../schema.js';
import type { SelectionRow } from '../selection.js';
import {
  type BatchClaimStatus,
  type ClaimStatus,
  claimSelectedForOneStatement,
  claimSelectedStatement,
} from '../sql/claim.js';
import { Batcher } from './batcher.js';
import type { PreparedStatements } from './prepared.js';
import type { RunStatement } from './retry.js';

/** Most claims in one statement. */
const MAX_BATCH = 64;

/** The statements a batch of claims can be sent with. */
type ClaimStatement = 'full' | 'quick' | 'forOne';

/**
 * Which statement a batch of claims goes with, and why each is kept. The
 * full statement is the one whose every answer is final; the others leave out
 * its second look at the selection, so a request they leave without a
 * machine and without a candidate must be asked again with the full one. Each
 * is kept because `npm run bench` (BENCH_ONLY=throughput) measured it worth
 * at least 10 % of throughput at some parallelism against the full statement
 * alone:
 *
 * | statement | for                                                       | final | worth          |
 * | --------- | --------------------------------------------------------- | ----- | -------------- |
 * | `forOne`  | a batch of one (a lone worker), unless `fullNext`         | no    | measured below |
 * | `quick`   | a batch of several, unless `fullNext`                     | no    | measured below |
 * | `full`    | a batch while `fullNext`, and the requests the others     | yes   | —              |
 * |           | left without machine or candidate                         |       |                |
 *
 * `fullNext`: once a selection's batch left a live request without a
 * machine, its next batches go to the full statement at once until one
 * serves every request, so an idle worker's look costs one statement, not
 * two.
 */
const CLAIM_STATEMENTS: Record<
  ClaimStatement,
  (process: string, selection: Expression<SelectionRow>, sessions: readonly string[]) => RawBuilder<BatchClaimStatus>
> = {
  full: (process, selection, sessions) => claimSelectedStatement(process, selection, sessions),
  quick: (process, selection, sessions) => claimSelectedStatement(process, selection, sessions, { lookFurther: false }),
  forOne: claimSelectedForOneStatement,
};

/** A claim request: who claims, and the metrics label to count the statement under. */
interface ClaimRequest {
  readonly sessionId: string;
  readonly processor: string;
}

/** The claims of one (selection, process): statements that differ only in their sessions share a batch. */
interface ClaimQueue {
  readonly process: string;
  readonly selection: Expression<SelectionRow>;
  readonly batcher: Batcher<ClaimRequest, ClaimStatus>;
  /** Whether the next batch goes to the full statement at once (see {@link CLAIM_STATEMENTS}). */
  fullNext: boolean;
}

/**
 * Claims from selections, batched: concurrent claims of the same process from
 * the same selection (the workers of one control loop) go to the database
 * together, as one statement that claims a machine for each of their
 * sessions (sql/claim.ts); see {@link Batcher} for when a batch leaves.
 */
export class SelectionClaims {
  readonly #queues = new Map<string, ClaimQueue>();
  /** A selection's SQL and parameters, by query; the query builders are immutable. */
  readonly #selectionKeys = new WeakMap<Expression<SelectionRow>, string>();

  constructor(
    private readonly db: Kysely<Database>,
    private readonly prepared: PreparedStatements,
    private readonly run: RunStatement,
  ) {}

  /**
   * Claims one machine of `selection` for the session; the answer is this
   * request's own. The request joins the queue of its (selection, process),
   * whose batcher sends it with the others in {@link SelectionClaims.#send}.
   */
  claim(
    sessionId: string,
    processor: string,
    process: string,
    selection: Expression<SelectionRow>,
  ): Promise<ClaimStatus> {
    const key = `${process}\u0000${this.#selectionKey(selection)}`;
    let queue = this.#queues.get(key);
    if (!queue) {
      const created: ClaimQueue = {
        process,
        selection,
        fullNext: false,
        batcher: new Batcher<ClaimRequest, ClaimStatus>({
          maxSize: MAX_BATCH,
          send: (requests) => this.#send(created, requests),
          // Selections may differ per call (a parameter each): keep only busy queues.
          onIdle: () => {
            if (this.#queues.get(key) === created) this.#queues.delete(key);
          },
        }),
      };
      queue = created;
      this.#queues.set(key, created);
    }
    return queue.batcher.submit({ sessionId, processor });
  }

  /**
   * Claims for `requests` as {@link CLAIM_STATEMENTS} says: with the quick
   * statement (`forOne` for one request) while claims come back served; a
   * request it leaves without a machine and without a candidate, and every
   * request after that until all are served again, goes to the full one.
   */
  async #send(queue: ClaimQueue, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    if (queue.fullNext) {
      const statuses = await this.#sendWith('full', queue, requests);
      queue.fullNext = statuses.some(unserved);
      return statuses;
    }
    const statuses = await this.#sendWith(requests.length === 1 ? 'forOne' : 'quick', queue, requests);
    const left = statuses.flatMap((status, i) => (unconfirmed(status) ? [i] : []));
    if (left.length === 0) return statuses;
    queue.fullNext = true;
    const again = await this.#sendWith(
      'full',
      queue,
      left.map((i) => requests[i] as ClaimRequest),
    );
    left.forEach((at, i) => {
      statuses[at] = again[i] as ClaimStatus;
    });
    return statuses;
  }

  async #sendWith(
    statement: ClaimStatement,
    queue: ClaimQueue,
    requests: readonly ClaimRequest[],
  ): Promise<ClaimStatus[]> {
    const sessions = requests.map((r) => r.sessionId);
    const compiled = CLAIM_STATEMENTS[statement](queue.process, queue.selection, sessions).compile(this.db);
    const processors = [...new Set(requests.map((r) => r.processor))];
    const rows = await this.run(processors, () => this.prepared.query<BatchClaimStatus>(compiled));
    const byRequest: ClaimStatus[] = new Array(requests.length);
    for (const row of rows) byRequest[Number(row.bmdb_ord) - 1] = row;
    for (let i = 0; i < requests.length; i++) {
      if (!byRequest[i])
        throw new BMDBError(`claim statement returned no row for request ${i + 1} of ${requests.length}`);
    }
    return byRequest;
  }

  /** `selection`'s SQL and parameters: selections that differ only by object share a queue. */
  #selectionKey(selection: Expression<SelectionRow>): string {
    let key = this.#selectionKeys.get(selection);
    if (key === undefined) {
      const compiled = sql`${selection}`.compile(this.db);
      key = `${compiled.sql}\u0000${JSON.stringify(compiled.parameters)}`;
      this.#selectionKeys.set(selection, key);
    }
    return key;
  }
}

/** Whether a live request was left without a machine. */
function unserved(status: ClaimStatus): boolean {
  return status.bmdb_live && !status.bmdb_claimed;
}

/** Whether a request's answer from a statement other than the full one needs the full statement to be final. */
function unconfirmed(status: ClaimStatus): boolean {
  return unserved(status) && status.bmdb_found === 0;
}
