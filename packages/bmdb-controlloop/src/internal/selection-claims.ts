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
type ClaimStatement = 'full' | 'forOne';

/**
 * Which statement a batch of claims goes with. The full statement is the one
 * whose every answer is final; a variant is kept only where `npm run bench`
 * (BENCH_ONLY=throughput, each variant alternated with the statements
 * without it) measured it worth at least 10 % of throughput at some
 * parallelism:
 *
 * | statement | sent for                                        | answers   | worth ×1 / ×8 / ×32  | kept |
 * | --------- | ----------------------------------------------- | --------- | -------------------- | ---- |
 * | `full`    | a batch of several; any batch while `fullNext`  | final     | the reference        | yes  |
 * | `forOne`  | a batch of one (a lone worker's claim)          | not final | +12 % / — / —        | yes  |
 * | quick     | a batch of several (`full` without `more`)      | not final | — / +0.5 % / +1.7 %  | no   |
 *
 * +12 %: items/s, median of 7 alternated rounds of 5,000 items at a load of
 * 3 to 5 (CPU time per item 10 % less, PostgreSQL's 16 %). +0.5 %, +1.7 %:
 * CPU time per item (Node and PostgreSQL), medians of 5 to 7 rounds, where a
 * load of 6 to 15 on the two cores left items/s unreadable. —: not sent at
 * that parallelism. The retriever's claim (`claimMachineStatement`) is no
 * variant: it claims the machine a retriever chose.
 *
 * `forOne` leaves out the full statement's second look at the selection
 * (`more`), so a request it leaves without a machine and without a candidate
 * is asked again with the full one; and once a batch left a live request
 * without a machine, the next go to the full statement until one serves
 * every request (`fullNext`), so an idle worker's look costs one statement,
 * not two.
 */
const CLAIM_STATEMENTS: Record<
  ClaimStatement,
  (process: string, selection: Expression<SelectionRow>, sessions: readonly string[]) => RawBuilder<BatchClaimStatus>
> = {
  full: claimSelectedStatement,
  forOne: claimSelectedForOneStatement,
};

/** A claim request: who claims, and the metrics label to count the statement under. */
interface ClaimRequest {
  readonly sessionId: string;
  readonly processor: string;
}

/**
 * What is kept of one (selection, process) for as long as the selection
 * lives (a control loop's, all its run): its statements, each compiled on
 * first use, and whether its next batch goes to the full statement.
 */
interface ClaimTemplate {
  readonly process: string;
  readonly selection: Expression<SelectionRow>;
  /** Equal for selections that differ only by object: their claims share a batch. */
  readonly key: string;
  readonly compiled: Partial<Record<ClaimStatement, CompiledClaim>>;
  /** Whether the next batch goes to the full statement at once (see {@link CLAIM_STATEMENTS}). */
  fullNext: boolean;
}

/**
 * A claim statement compiled once for its template: compiling one costs
 * more than a lone worker's claim can spare (more than a tenth of its CPU
 * time per item in `npm run bench`). It is compiled with {@link SESSIONS}
 * for its session IDs; a batch's IDs go where that placeholder stands.
 */
interface CompiledClaim {
  readonly sql: string;
  readonly parameters: readonly unknown[];
}

/** What a claim statement is compiled with in place of a batch's session IDs, found again by identity. */
const SESSIONS: readonly string[] = Object.freeze([]);

/**
 * Claims from selections, batched: concurrent claims of the same process from
 * the same selection (the workers of one control loop) go to the database
 * together, as one statement that claims a machine for each of their
 * sessions (sql/claim.ts); see {@link Batcher} for when a batch leaves.
 */
export class SelectionClaims {
  /** Templates by selection query and process; the query builders are immutable. */
  readonly #templates = new WeakMap<Expression<SelectionRow>, Map<string, ClaimTemplate>>();
  /** Batchers by template key, while they have claims to send. */
  readonly #batchers = new Map<string, Batcher<ClaimRequest, ClaimStatus>>();

  constructor(
    private readonly db: Kysely<Database>,
    private readonly prepared: PreparedStatements,
    private readonly run: RunStatement,
  ) {}

  /**
   * Claims one machine of `selection` for the session; the answer is this
   * request's own. The request joins the batcher of its (selection,
   * process), which sends it with the others in {@link SelectionClaims.#send}.
   */
  claim(
    sessionId: string,
    processor: string,
    process: string,
    selection: Expression<SelectionRow>,
  ): Promise<ClaimStatus> {
    const template = this.#template(process, selection);
    let batcher = this.#batchers.get(template.key);
    if (!batcher) {
      const created = new Batcher<ClaimRequest, ClaimStatus>({
        maxSize: MAX_BATCH,
        send: (requests) => this.#send(template, requests),
        // Selections may differ per call (a parameter each): keep only busy batchers.
        onIdle: () => {
          if (this.#batchers.get(template.key) === created) this.#batchers.delete(template.key);
        },
      });
      batcher = created;
      this.#batchers.set(template.key, created);
    }
    return batcher.submit({ sessionId, processor });
  }

  /**
   * Claims for `requests` as {@link CLAIM_STATEMENTS} says: a lone request
   * with `forOne` while claims come back served, confirmed by the full
   * statement when it found nothing; every other batch with the full one.
   */
  async #send(template: ClaimTemplate, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    if (template.fullNext || requests.length > 1) {
      const statuses = await this.#sendWith('full', template, requests);
      template.fullNext = statuses.some(unserved);
      return statuses;
    }
    const statuses = await this.#sendWith('forOne', template, requests);
    if (!statuses.some(unconfirmed)) return statuses;
    template.fullNext = true;
    return this.#sendWith('full', template, requests);
  }

  async #sendWith(
    statement: ClaimStatement,
    template: ClaimTemplate,
    requests: readonly ClaimRequest[],
  ): Promise<ClaimStatus[]> {
    const { process, selection } = template;
    template.compiled[statement] ??= CLAIM_STATEMENTS[statement](process, selection, SESSIONS).compile(this.db);
    const { sql, parameters } = template.compiled[statement];
    const sessions = requests.map((r) => r.sessionId);
    const compiled = { sql, parameters: parameters.map((value) => (value === SESSIONS ? sessions : value)) };
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

  /** The template of (`selection`, `process`), made on first use. */
  #template(process: string, selection: Expression<SelectionRow>): ClaimTemplate {
    let byProcess = this.#templates.get(selection);
    if (!byProcess) {
      byProcess = new Map();
      this.#templates.set(selection, byProcess);
    }
    let template = byProcess.get(process);
    if (!template) {
      const compiled = sql`${selection}`.compile(this.db);
      const key = `${process}\u0000${compiled.sql}\u0000${JSON.stringify(compiled.parameters)}`;
      template = { process, selection, key, compiled: {}, fullNext: false };
      byProcess.set(process, template);
    }
    return template;
  }
}

/** Whether a live request was left without a machine. */
function unserved(status: ClaimStatus): boolean {
  return status.bmdb_live && !status.bmdb_claimed;
}

/** Whether a request's answer from `forOne` needs the full statement to be final. */
function unconfirmed(status: ClaimStatus): boolean {
  return unserved(status) && status.bmdb_found === 0;
}
