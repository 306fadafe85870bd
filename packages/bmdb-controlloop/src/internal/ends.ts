import { type EndRequest, endWorkParameters, endWorkStatement, partsOfBatch } from '../sql/end-work.js';
import { Batcher } from './batcher.js';
import { onePerMachine } from './machine-batches.js';
import type { PreparedStatements } from './prepared.js';
import type { RunStatement } from './retry.js';

/** Most ends in one statement. */
const MAX_BATCH = 64;

/**
 * Ends work items, batched: the finishes (declarative ones), failures and
 * cancels of every session of a BMDB connection go to the database together,
 * as one statement (see {@link Batcher} for when a batch leaves). A batch
 * holds at most one request per machine, so that the tag writes of one
 * statement never meet on a row.
 */
export class Ends {
  readonly #batcher = new Batcher<EndRequest, boolean>({
    maxSize: MAX_BATCH,
    ...onePerMachine<EndRequest>(),
    send: (requests) => this.#send(requests),
  });
  /** Statements by their parts, built once each. */
  readonly #statements = new Map<number, string>();

  constructor(
    private readonly prepared: PreparedStatements,
    private readonly run: RunStatement,
  ) {}

  /** Resolves true once ended, false if the session no longer held the claim. */
  end(request: EndRequest): Promise<boolean> {
    return this.#batcher.submit(request);
  }

  async #send(requests: readonly EndRequest[]): Promise<boolean[]> {
    const parameters = endWorkParameters(requests);
    const parts = partsOfBatch(requests);
    let statement = this.#statements.get(parts);
    if (statement === undefined) {
      statement = endWorkStatement(parts);
      this.#statements.set(parts, statement);
    }
    const sql = statement;
    const processors = [...new Set(requests.map((r) => r.processor))];
    const [row] = await this.run(processors, () => this.prepared.query<{ released: number[] }>({ sql, parameters }));
    const ended = new Set(row?.released ?? []);
    return requests.map((_, i) => ended.has(i + 1));
  }
}
