import type { BMDBMetrics } from '../metrics.js';
import { type EndRequest, endWorkParameters, endWorkStatement, partsOfBatch } from '../sql/end-work.js';
import { type Batch, Batcher } from './batcher.js';
import { isConnectionLost } from './connection-lost.js';
import type { PreparedStatements } from './prepared.js';
import { withRetry } from './retry.js';
import { retryMetrics } from './retry-metrics.js';

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
  readonly #batcher = new Batcher<EndRequest, boolean>({ maxSize: MAX_BATCH, onePerMachine: true });
  /** Statements by their parts, built once each. */
  readonly #statements = new Map<number, string>();

  constructor(
    private readonly prepared: PreparedStatements,
    private readonly metrics: BMDBMetrics | undefined,
  ) {}

  /** Resolves true once ended, false if the session no longer held the claim. */
  end(request: EndRequest): Promise<boolean> {
    const ended = this.#batcher.submit(request);
    if (!this.#batcher.sending) void this.#sendBatches();
    return ended;
  }

  /** Sends the queued ends, a batch at a time, until none is left; never rejects. */
  async #sendBatches(): Promise<void> {
    for await (const batch of this.#batcher.batches()) await this.#sendBatch(batch);
  }

  /**
   * Sends one batch and answers its requests. A batch that failed for
   * anything but a lost connection (one request's bad value, say a time
   * PostgreSQL cannot store) is sent again request by request, so that it
   * fails only that one.
   */
  async #sendBatch(batch: Batch<EndRequest, boolean>): Promise<void> {
    try {
      batch.resolve(await this.#send(batch.items));
    } catch (error) {
      if (batch.items.length === 1 || isConnectionLost(error)) batch.reject(error);
      else for (const one of batch.isolated()) await this.#sendBatch(one);
    }
  }

  async #send(requests: readonly EndRequest[]): Promise<boolean[]> {
    const parts = partsOfBatch(requests);
    let statement = this.#statements.get(parts);
    if (statement === undefined) {
      statement = endWorkStatement(parts);
      this.#statements.set(parts, statement);
    }
    const query = { sql: statement, parameters: endWorkParameters(requests) };
    const processors = [...new Set(requests.map((r) => r.processor))];
    const rows = await withRetry(
      () => this.prepared.query<{ released: number[] }>(query),
      retryMetrics(this.metrics, processors),
    );
    const ended = new Set(rows[0]?.released ?? []);
    return requests.map((_, i) => ended.has(i + 1));
  }
}
