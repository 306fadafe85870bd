import { setImmediate as nextTurn } from 'node:timers/promises';

/** A submitted item and how to answer its caller. */
interface Waiting<I, R> {
  readonly item: I;
  resolve(result: R): void;
  reject(error: unknown): void;
}

/** What a batch of a {@link Batcher} may hold. */
export interface BatcherOptions {
  /** Most items in one batch. */
  readonly maxSize: number;
  /**
   * At most one item per machine a batch (items with a `machineId`): the
   * writes of one statement then never meet on a row. An item whose machine
   * is in the batch already waits for the next, keeping its place in the
   * queue.
   */
  readonly onePerMachine?: boolean;
}

/** Items taken from a {@link Batcher} together, and how to answer their callers. */
export class Batch<I, R> {
  readonly items: readonly I[];

  constructor(private readonly waiting: readonly Waiting<I, R>[]) {
    this.items = waiting.map((w) => w.item);
  }

  /** Answers each item with its result, in order; throws (answering none) if there is not one result per item. */
  resolve(results: readonly R[]): void {
    if (results.length !== this.waiting.length) {
      throw new Error(`a batch of ${this.waiting.length} returned ${results.length} results`);
    }
    for (let i = 0; i < results.length; i++) this.waiting[i]?.resolve(results[i] as R);
  }

  /** Fails every item with `error`. */
  reject(error: unknown): void {
    for (const waiting of this.waiting) waiting.reject(error);
  }

  /**
   * A batch of one for each item: a batch that failed for what may be one
   * item's fault (a bad value) is sent again item by item, so that it fails
   * that item alone.
   */
  isolated(): Batch<I, R>[] {
    return this.waiting.map((waiting) => new Batch([waiting]));
  }
}

/**
 * A queue of what callers submit, taken in batches by its owner, one batch
 * in flight at a time, with no timer. The owner submits an item and, when
 * nobody sends the queue's batches (`sending` is false), loops over
 * {@link Batcher.batches}, sending each batch itself before asking for the
 * next; the loop ends once the queue is empty.
 *
 * Items submitted while no batch is in flight go at the end of the current
 * turn of the event loop, together; items submitted while one is in flight
 * wait for it to return, and then go together: the callers a returning batch
 * resumes ask again in the same turn. Under load a batch holds whatever
 * arrived during the last one's round trip; an idle caller waits for nothing
 * but the end of its own turn.
 */
export class Batcher<I extends object, R> {
  #queue: Waiting<I, R>[] = [];
  #sending = false;

  constructor(private readonly options: BatcherOptions) {}

  /** Whether an owner's loop over {@link Batcher.batches} is running. */
  get sending(): boolean {
    return this.#sending;
  }

  /** Whether nothing is queued or being sent. */
  get idle(): boolean {
    return !this.#sending && this.#queue.length === 0;
  }

  /** Resolves with `item`'s own result; rejects if its batch failed. */
  submit(item: I): Promise<R> {
    return new Promise<R>((resolve, reject) => this.#queue.push({ item, resolve, reject }));
  }

  /**
   * The batches to send, each taken at the end of the turn in which the last
   * one returned (the first, at the end of this turn); it ends when there is
   * nothing left to take. One loop at a time: it starts sending at once.
   */
  batches(): AsyncGenerator<Batch<I, R>> {
    this.#sending = true;
    return this.#batches();
  }

  async *#batches(): AsyncGenerator<Batch<I, R>> {
    try {
      for (;;) {
        await nextTurn();
        const batch = this.#take();
        if (batch.length === 0) return;
        yield new Batch(batch);
      }
    } finally {
      this.#sending = false;
    }
  }

  /** The next batch, in queue order, skipping items of a machine the batch holds already. */
  #take(): Waiting<I, R>[] {
    const { maxSize, onePerMachine } = this.options;
    if (!onePerMachine) return this.#queue.splice(0, maxSize);
    const batch: Waiting<I, R>[] = [];
    const machines = new Set<unknown>();
    const rest: Waiting<I, R>[] = [];
    for (const waiting of this.#queue) {
      const machine = machineOf(waiting.item);
      if (batch.length < maxSize && !machines.has(machine)) {
        batch.push(waiting);
        machines.add(machine);
      } else {
        rest.push(waiting);
      }
    }
    this.#queue = rest;
    return batch;
  }
}

/** The machine an item writes (its `machineId`), if it names one. */
function machineOf(item: object): unknown {
  return 'machineId' in item ? item.machineId : undefined;
}
