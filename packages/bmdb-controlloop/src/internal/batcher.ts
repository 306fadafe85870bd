/** A submitted item and how to answer its caller. */
interface Waiting<I, R> {
  readonly item: I;
  resolve(result: R): void;
  reject(error: unknown): void;
}

export interface BatcherOptions<I, Result> {
  /** Sends a batch; resolves with one result per item, in order. A rejection fails every item. */
  send(items: readonly I[]): Promise<readonly Result[]>;
  /** Most items in one batch. */
  readonly maxSize: number;
  /**
   * Whether `item` may join a batch already holding `batch`; an item refused
   * waits for the next batch, keeping its place in the queue.
   */
  admits?(batch: readonly I[], item: I): boolean;
  /**
   * Whether a batch of several items that failed with `error` may have
   * failed for one item alone: each item is then sent again on its own, to
   * succeed or fail by itself. Errors that hit every item alike (a lost
   * connection) need not be.
   */
  isolates?(error: unknown): boolean;
  /** Called whenever the last batch returned and nothing is queued. */
  onIdle?(): void;
}

/**
 * Sends what callers submit in batches, one batch in flight at a time, with
 * no timer: items submitted while no batch is in flight go at the end of the
 * current turn of the event loop, together; items submitted while one is in
 * flight wait for it to return, and then go together. Under load a batch
 * holds whatever arrived during the last one's round trip; an idle caller
 * waits for nothing but the end of its own turn.
 */
export class Batcher<I, Result> {
  #queue: Waiting<I, Result>[] = [];
  #inFlight = false;
  #scheduled = false;

  constructor(private readonly options: BatcherOptions<I, Result>) {}

  /** Whether nothing is queued, scheduled or in flight. */
  get idle(): boolean {
    return !this.#inFlight && !this.#scheduled && this.#queue.length === 0;
  }

  /** Resolves with `item`'s own result; rejects if its batch failed as a whole. */
  submit(item: I): Promise<Result> {
    return new Promise<Result>((resolve, reject) => {
      this.#queue.push({ item, resolve, reject });
      this.#schedule();
    });
  }

  /**
   * Sends the next batch at the end of this turn of the event loop, unless
   * one is in flight: the callers a returning batch resumes ask again in the
   * same turn, and go together.
   */
  #schedule(): void {
    if (this.#inFlight || this.#scheduled || this.#queue.length === 0) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      this.#sendNext();
    });
  }

  #sendNext(): void {
    const batch = this.#take();
    if (batch.length === 0) return;
    this.#inFlight = true;
    void this.#send(batch).finally(() => {
      this.#inFlight = false;
      this.#schedule();
      if (this.idle) this.options.onIdle?.();
    });
  }

  /** Sends `batch` and settles each of its items; never rejects. */
  async #send(batch: readonly Waiting<I, Result>[]): Promise<void> {
    let results: readonly Result[];
    try {
      results = await this.options.send(batch.map((waiting) => waiting.item));
      if (results.length !== batch.length) {
        throw new Error(`a batch of ${batch.length} returned ${results.length} results`);
      }
    } catch (error) {
      if (batch.length > 1 && this.options.isolates?.(error)) {
        for (const waiting of batch) await this.#send([waiting]);
      } else {
        for (const waiting of batch) waiting.reject(error);
      }
      return;
    }
    for (let i = 0; i < batch.length; i++) batch[i]?.resolve(results[i] as Result);
  }

  /** The next batch, in queue order, skipping items the batch cannot admit. */
  #take(): Waiting<I, Result>[] {
    const { maxSize, admits } = this.options;
    if (!admits) return this.#queue.splice(0, maxSize);
    const batch: Waiting<I, Result>[] = [];
    const items: I[] = [];
    const rest: Waiting<I, Result>[] = [];
    for (const waiting of this.#queue) {
      if (batch.length < maxSize && admits(items, waiting.item)) {
        batch.push(waiting);
        items.push(waiting.item);
      } else {
        rest.push(waiting);
      }
    }
    this.#queue = rest;
    return batch;
  }
}
