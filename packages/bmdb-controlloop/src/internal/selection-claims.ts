import { type Expression, type Kysely, type RawBuilder, sql } from 'kysely';
import { BMDBError } from '../errors.js';
import type { BMDBMetrics } from '../metrics.js';
import type { Database } from '../schema.js';
import {
  type BatchClaimStatus,
  type ClaimStatus,
  claimSelectedForOneStatement,
  claimSelectedStatement,
  type SelectionRow,
} from '../sql/claim.js';
import { type Batch, Batcher } from './batcher.js';
import type { PreparedStatements } from './prepared.js';
import { withRetry } from './retry.js';
import { retryMetrics } from './retry-metrics.js';

/** Most claims in one statement. */
const MAX_BATCH = 64;

/*
 * Which statement a batch of claims goes with (SelectionClaims.#send). The
 * full statement (`claimSelectedStatement`) is the one whose every answer is
 * final; a variant is kept only where `npm run bench` (BENCH_ONLY=throughput,
 * each variant alternated with the statements without it) measured it worth
 * at least 10 % of throughput at some parallelism:
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
 * `forOne` (`claimSelectedForOneStatement`) leaves out the full statement's
 * second look at the selection (`more`), so a request it leaves without a
 * machine and without a candidate is asked again with the full one; and once
 * a batch left a live request without a machine, the next go to the full
 * statement until one serves every request (`fullNext`), so an idle worker's
 * look costs one statement, not two.
 */

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
  /** The full statement, compiled on first use. */
  full: CompiledClaim | undefined;
  /** The statement for one request, compiled on first use. */
  forOne: CompiledClaim | undefined;
  /** Whether the next batch goes to the full statement at once (see the table above). */
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
    private readonly metrics: BMDBMetrics | undefined,
  ) {}

  /**
   * Claims one machine of `selection` for the session; the answer is this
   * request's own. The request joins the batcher of its (selection,
   * process), whose batches {@link SelectionClaims.#sendBatches} sends.
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
      batcher = new Batcher<ClaimRequest, ClaimStatus>({ maxSize: MAX_BATCH });
      this.#batchers.set(template.key, batcher);
    }
    const claimed = batcher.submit({ sessionId, processor });
    if (!batcher.sending) void this.#sendBatches(template, batcher);
    return claimed;
  }

  /** Sends the batcher's claims, a batch at a time, until none is left; never rejects. */
  async #sendBatches(template: ClaimTemplate, batcher: Batcher<ClaimRequest, ClaimStatus>): Promise<void> {
    for await (const batch of batcher.batches()) await this.#sendBatch(template, batch);
    // Selections may differ per call (a parameter each): keep only busy batchers.
    if (batcher.idle && this.#batchers.get(template.key) === batcher) this.#batchers.delete(template.key);
  }

  /** Sends one batch and answers its requests; a failure fails them all (it is no one request's). */
  async #sendBatch(template: ClaimTemplate, batch: Batch<ClaimRequest, ClaimStatus>): Promise<void> {
    try {
      batch.resolve(await this.#send(template, batch.items));
    } catch (error) {
      batch.reject(error);
    }
  }

  /**
   * Claims for `requests` as the table above says: a lone request with
   * `forOne` while claims come back served, confirmed by the full statement
   * when it found nothing; every other batch with the full one.
   */
  async #send(template: ClaimTemplate, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    const { process, selection } = template;
    if (template.fullNext || requests.length > 1) {
      template.full ??= this.#compile(claimSelectedStatement(process, selection, SESSIONS));
      const statuses = await this.#sendWith(template.full, requests);
      template.fullNext = statuses.some(unserved);
      return statuses;
    }
    template.forOne ??= this.#compile(claimSelectedForOneStatement(process, selection, SESSIONS));
    const statuses = await this.#sendWith(template.forOne, requests);
    if (!statuses.some(unconfirmed)) return statuses;
    template.fullNext = true;
    template.full ??= this.#compile(claimSelectedStatement(process, selection, SESSIONS));
    return this.#sendWith(template.full, requests);
  }

  /** A claim statement compiled with {@link SESSIONS} for its session IDs. */
  #compile(statement: RawBuilder<BatchClaimStatus>): CompiledClaim {
    const { sql, parameters } = statement.compile(this.db);
    return { sql, parameters };
  }

  /** Sends `statement` for `requests`, with their session IDs where {@link SESSIONS} stands; one status each. */
  async #sendWith(statement: CompiledClaim, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    const sessions = requests.map((r) => r.sessionId);
    const query = {
      sql: statement.sql,
      parameters: statement.parameters.map((value) => (value === SESSIONS ? sessions : value)),
    };
    const processors = [...new Set(requests.map((r) => r.processor))];
    const rows = await withRetry(
      () => this.prepared.query<BatchClaimStatus>(query),
      retryMetrics(this.metrics, processors),
    );
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
      template = { process, selection, key, full: undefined, forOne: undefined, fullNext: false };
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
