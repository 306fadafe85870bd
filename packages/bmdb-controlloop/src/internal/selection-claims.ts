import type { Expression, Kysely, RawBuilder } from 'kysely';
import { BMDBError } from '../errors.js';
import type { Database } from '../schema.js';
import type { SelectionRow } from '../selection.js';
import { claimSelectedStatement } from '../sql/claim-selected.js';
import { claimSelectedForOneStatement } from '../sql/claim-selected-for-one.js';
import type { BatchClaimStatus, ClaimStatus } from '../sql/claim-status.js';
import { Batcher } from './batcher.js';
import type { PreparedStatements } from './prepared.js';
import type { RunStatement } from './retry.js';

/** Most claims in one statement. */
const MAX_BATCH = 64;

/** One claim statement, compiled once. */
interface CompiledClaim {
  readonly sql: string;
  readonly parameters: readonly unknown[];
  /** Positions of the session IDs among the parameters (the statement uses them more than once). */
  readonly sessionsAt: readonly number[];
}

/** The claim statements of one (selection, process). */
interface ClaimTemplate {
  /** Without the second look at the selection: its empty answers are not final. */
  readonly quick: CompiledClaim;
  /** {@link ClaimTemplate.quick} for a batch of one: a lone worker's usual claim. */
  readonly quickForOne: CompiledClaim;
  /** The full statement, whose every answer is final. */
  readonly thorough: CompiledClaim;
  /** Equal for statements that differ only in their sessions: they can share a batch. */
  readonly key: string;
  /**
   * Whether the last batch left a request without a machine: the next goes
   * straight to the full statement, so an idle worker's look costs one
   * statement, not two.
   */
  short: boolean;
}

/** A claim request: who claims, and the metrics label to count the statement under. */
interface ClaimRequest {
  readonly sessionId: string;
  readonly processor: string;
}

/**
 * Claims from selections, batched: concurrent claims of the same process from
 * the same selection (the workers of one control loop) go to the database
 * together, as one statement that claims a machine for each of their
 * sessions (sql/claim-selected.ts); see {@link Batcher} for when a batch leaves.
 */
export class SelectionClaims {
  /** Compiled statements, by selection query and process; the query builders are immutable. */
  readonly #templates = new WeakMap<Expression<SelectionRow>, Map<string, ClaimTemplate>>();
  readonly #batchers = new Map<string, Batcher<ClaimRequest, ClaimStatus>>();

  constructor(
    private readonly db: Kysely<Database>,
    private readonly prepared: PreparedStatements,
    private readonly run: RunStatement,
  ) {}

  /** Claims one machine of `selection` for the session; the answer is this request's own. */
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
   * Claims for `requests` with the quick statement while claims come back
   * served; a request it leaves without a machine, and every request after
   * that until all are served again, goes to the full statement.
   */
  async #send(template: ClaimTemplate, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    if (template.short) {
      const statuses = await this.#sendWith(template.thorough, requests);
      template.short = statuses.some(unserved);
      return statuses;
    }
    const statuses = await this.#sendWith(requests.length === 1 ? template.quickForOne : template.quick, requests);
    const left = statuses.flatMap((status, i) => (unconfirmed(status) ? [i] : []));
    if (left.length === 0) return statuses;
    template.short = true;
    const again = await this.#sendWith(
      template.thorough,
      left.map((i) => requests[i] as ClaimRequest),
    );
    left.forEach((at, i) => {
      statuses[at] = again[i] as ClaimStatus;
    });
    return statuses;
  }

  async #sendWith(statement: CompiledClaim, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    const parameters = [...statement.parameters];
    const sessions = requests.map((r) => r.sessionId);
    for (const at of statement.sessionsAt) parameters[at] = sessions;
    const processors = [...new Set(requests.map((r) => r.processor))];
    const rows = await this.run(processors, () =>
      this.prepared.query<BatchClaimStatus>({ sql: statement.sql, parameters }),
    );
    const byRequest: ClaimStatus[] = new Array(requests.length);
    for (const row of rows) byRequest[Number(row.bmdb_ord) - 1] = row;
    for (let i = 0; i < requests.length; i++) {
      if (!byRequest[i])
        throw new BMDBError(`claim statement returned no row for request ${i + 1} of ${requests.length}`);
    }
    return byRequest;
  }

  #template(process: string, selection: Expression<SelectionRow>): ClaimTemplate {
    let byProcess = this.#templates.get(selection);
    if (!byProcess) {
      byProcess = new Map();
      this.#templates.set(selection, byProcess);
    }
    let template = byProcess.get(process);
    if (!template) {
      const quick = compileClaim(this.db, (sessions) =>
        claimSelectedStatement(process, selection, sessions, { lookFurther: false }),
      );
      const quickForOne = compileClaim(this.db, (sessions) =>
        claimSelectedForOneStatement(process, selection, sessions),
      );
      const thorough = compileClaim(this.db, (sessions) => claimSelectedStatement(process, selection, sessions));
      template = { quick, quickForOne, thorough, key: thorough.key, short: false };
      byProcess.set(process, template);
    }
    return template;
  }
}

/** Whether a live request was left without a machine. */
function unserved(status: ClaimStatus): boolean {
  return status.bmdb_live && !status.bmdb_claimed;
}

/** Whether the quick statement's answer for a request needs the full statement to be final. */
function unconfirmed(status: ClaimStatus): boolean {
  return unserved(status) && status.bmdb_found === 0;
}

/**
 * A claim statement. The session IDs are a parameter like any other:
 * compiled with a placeholder array, found again by identity, and swapped
 * per batch.
 */
function compileClaim(
  db: Kysely<Database>,
  statement: (sessions: readonly string[]) => RawBuilder<BatchClaimStatus>,
): CompiledClaim & { readonly key: string } {
  const placeholder: string[] = [];
  const compiled = statement(placeholder).compile(db);
  const parameters = [...compiled.parameters];
  const sessionsAt = parameters.flatMap((value, i) => (value === placeholder ? [i] : []));
  if (sessionsAt.length === 0) throw new BMDBError('claim statement lost its sessions parameter');
  const others = parameters.filter((value) => value !== placeholder);
  return { sql: compiled.sql, parameters, sessionsAt, key: `${compiled.sql}\u0000${JSON.stringify(others)}` };
}
