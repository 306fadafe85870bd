import type { Expression, Kysely } from 'kysely';
import { type BatchClaimStatus, type ClaimStatus, claimSelectedStatement } from '../claim.js';
import { BMDBError } from '../errors.js';
import type { Database } from '../schema.js';
import type { SelectionRow } from '../selection.js';
import { Batcher } from './batcher.js';
import type { PreparedStatements } from './prepared.js';
import type { RunStatement } from './retry.js';

/** Most claims in one statement. */
const MAX_BATCH = 64;

/** The claim statement of one (selection, process), compiled once. */
interface ClaimTemplate {
  readonly sql: string;
  readonly parameters: readonly unknown[];
  /** Positions of the session IDs among the parameters (the statement uses them more than once). */
  readonly sessionsAt: readonly number[];
  /** Equal for statements that differ only in their sessions: they can share a batch. */
  readonly key: string;
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
 * sessions (claim.ts); see {@link Batcher} for when a batch leaves.
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

  async #send(template: ClaimTemplate, requests: readonly ClaimRequest[]): Promise<ClaimStatus[]> {
    const parameters = [...template.parameters];
    const sessions = requests.map((r) => r.sessionId);
    for (const at of template.sessionsAt) parameters[at] = sessions;
    const processors = [...new Set(requests.map((r) => r.processor))];
    const rows = await this.run(processors, () =>
      this.prepared.query<BatchClaimStatus>({ sql: template.sql, parameters }),
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
      // The session IDs are a parameter like any other: compile with a
      // placeholder array, found again by identity, and swap it per batch.
      const placeholder: string[] = [];
      const compiled = claimSelectedStatement(process, selection, placeholder).compile(this.db);
      const parameters = [...compiled.parameters];
      const sessionsAt = parameters.flatMap((value, i) => (value === placeholder ? [i] : []));
      if (sessionsAt.length === 0) throw new BMDBError('claim statement lost its sessions parameter');
      const others = parameters.filter((value) => value !== placeholder);
      template = {
        sql: compiled.sql,
        parameters,
        sessionsAt,
        key: `${compiled.sql}\u0000${JSON.stringify(others)}`,
      };
      byProcess.set(process, template);
    }
    return template;
  }
}
