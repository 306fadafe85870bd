import { describe, expect, test } from 'vitest';
import { type Batch, Batcher, type BatcherOptions } from '../src/internal/batcher.js';
import { deferred } from './helpers.js';

/** An item of the tests: a name whose first letter stands for its machine. */
interface Item {
  readonly name: string;
  readonly machineId: string;
}

/**
 * A batcher driven as the library's owners drive theirs (internal/ends.ts):
 * each submit starts the loop over its batches unless one runs, each batch is
 * sent by `send`, and a batch failing with an error `isolates` accepts is
 * sent again item by item.
 */
class Owner {
  readonly batcher: Batcher<Item, string>;
  idle = 0;

  constructor(
    options: BatcherOptions,
    private readonly send: (items: readonly string[]) => Promise<readonly string[]>,
    private readonly isolates: (error: unknown) => boolean = () => false,
  ) {
    this.batcher = new Batcher(options);
  }

  submit(name: string): Promise<string> {
    const result = this.batcher.submit({ name, machineId: name[0] ?? '' });
    if (!this.batcher.sending) void this.#sendBatches();
    return result;
  }

  async #sendBatches(): Promise<void> {
    for await (const batch of this.batcher.batches()) await this.#sendBatch(batch);
    if (this.batcher.idle) this.idle++;
  }

  async #sendBatch(batch: Batch<Item, string>): Promise<void> {
    try {
      batch.resolve(await this.send(batch.items.map((item) => item.name)));
    } catch (error) {
      if (batch.items.length === 1 || !this.isolates(error)) batch.reject(error);
      else for (const one of batch.isolated()) await this.#sendBatch(one);
    }
  }
}

/** A batcher whose batches the test answers by hand; records what each batch held. */
function manual(options: { maxSize?: number; onePerMachine?: boolean } = {}) {
  const sent: string[][] = [];
  const answers: { resolve(value: readonly string[]): void; reject(error: unknown): void }[] = [];
  const owner = new Owner(
    { maxSize: options.maxSize ?? 64, ...(options.onePerMachine && { onePerMachine: true }) },
    (items) => {
      sent.push([...items]);
      return new Promise((resolve, reject) => answers.push({ resolve, reject }));
    },
  );
  /** Waits until `n` batches have been sent. */
  const sentCount = async (n: number) => {
    while (sent.length < n) await new Promise((resolve) => setImmediate(resolve));
  };
  return { batcher: owner, sent, answers, sentCount, idleCalls: () => owner.idle };
}

describe('Batcher', () => {
  test('items submitted in one turn go together, and each caller gets its own result', async () => {
    const { batcher, sent, answers, sentCount } = manual();
    const results = ['a', 'b', 'c'].map((item) => batcher.submit(item));
    await sentCount(1);
    expect(sent).toEqual([['a', 'b', 'c']]);
    answers[0]?.resolve(['A', 'B', 'C']);
    expect(await Promise.all(results)).toEqual(['A', 'B', 'C']);
  });

  test('items submitted while a batch is in flight go together once it returns', async () => {
    const { batcher, sent, answers, sentCount, idleCalls } = manual();
    const first = batcher.submit('a');
    await sentCount(1);
    const later = [batcher.submit('b'), batcher.submit('c')];
    await new Promise((resolve) => setImmediate(resolve));
    expect(sent).toEqual([['a']]); // nothing more while one is in flight
    answers[0]?.resolve(['A']);
    expect(await first).toBe('A');
    await sentCount(2);
    expect(sent[1]).toEqual(['b', 'c']);
    expect(idleCalls()).toBe(0);
    answers[1]?.resolve(['B', 'C']);
    expect(await Promise.all(later)).toEqual(['B', 'C']);
    await new Promise((resolve) => setImmediate(resolve));
    expect(batcher.batcher.idle).toBe(true);
    expect(idleCalls()).toBe(1);
  });

  test('a failed batch fails each of its items with its error; the next batch still goes', async () => {
    const { batcher, answers, sentCount } = manual();
    const failing = [batcher.submit('a'), batcher.submit('b')];
    await sentCount(1);
    const next = batcher.submit('c');
    const error = new Error('connection lost');
    answers[0]?.reject(error);
    for (const result of failing) await expect(result).rejects.toBe(error);
    await sentCount(2);
    answers[1]?.resolve(['C']);
    expect(await next).toBe('C');
  });

  test('a batch failing with an error to isolate is sent again item by item, each failing or not on its own', async () => {
    const sent: string[][] = [];
    const batcher = new Owner(
      { maxSize: 8 },
      async (items) => {
        sent.push([...items]);
        if (items.includes('bad')) throw new RangeError('bad value');
        return items.map((item) => item.toUpperCase());
      },
      (error) => error instanceof RangeError,
    );
    const results = await Promise.allSettled(['a', 'bad', 'c'].map((item) => batcher.submit(item)));
    expect(results).toEqual([
      { status: 'fulfilled', value: 'A' },
      { status: 'rejected', reason: new RangeError('bad value') },
      { status: 'fulfilled', value: 'C' },
    ]);
    expect(sent).toEqual([['a', 'bad', 'c'], ['a'], ['bad'], ['c']]);
  });

  test('a batch answering with the wrong number of results fails every item', async () => {
    const { batcher, answers, sentCount } = manual();
    const results = [batcher.submit('a'), batcher.submit('b')];
    await sentCount(1);
    answers[0]?.resolve(['A']);
    for (const result of results) await expect(result).rejects.toThrow('a batch of 2 returned 1 results');
  });

  test('an item of a machine the batch holds already waits for the next one, keeping its place', async () => {
    // At most one item per letter, as releases hold at most one request per machine.
    const { batcher, sent, answers, sentCount } = manual({ onePerMachine: true });
    const results = ['a1', 'b1', 'a2', 'c1', 'a3'].map((item) => batcher.submit(item));
    await sentCount(1);
    expect(sent[0]).toEqual(['a1', 'b1', 'c1']);
    answers[0]?.resolve(['A1', 'B1', 'C1']);
    await sentCount(2);
    expect(sent[1]).toEqual(['a2']);
    answers[1]?.resolve(['A2']);
    await sentCount(3);
    expect(sent[2]).toEqual(['a3']);
    answers[2]?.resolve(['A3']);
    expect(await Promise.all(results)).toEqual(['A1', 'B1', 'A2', 'C1', 'A3']);
  });

  test('batches hold at most maxSize items', async () => {
    const { batcher, sent, answers, sentCount } = manual({ maxSize: 2 });
    const results = ['a', 'b', 'c'].map((item) => batcher.submit(item));
    await sentCount(1);
    expect(sent[0]).toEqual(['a', 'b']);
    answers[0]?.resolve(['A', 'B']);
    await sentCount(2);
    expect(sent[1]).toEqual(['c']);
    answers[1]?.resolve(['C']);
    expect(await Promise.all(results)).toEqual(['A', 'B', 'C']);
  });

  test('a send that throws synchronously fails its items rather than the caller', async () => {
    const gate = deferred();
    const batcher = new Owner({ maxSize: 8 }, () => {
      gate.resolve();
      throw new Error('cannot send');
    });
    const result = batcher.submit('a');
    await gate.promise;
    await expect(result).rejects.toThrow('cannot send');
  });
});
