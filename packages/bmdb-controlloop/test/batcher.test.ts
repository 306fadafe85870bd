import { describe, expect, test } from 'vitest';
import { Batcher } from '../src/internal/batcher.js';
import { deferred } from './helpers.js';

/** A batcher whose batches the test answers by hand; records what each batch held. */
function manual(options: { maxSize?: number; admits?: (batch: readonly string[], item: string) => boolean } = {}) {
  const sent: string[][] = [];
  const answers: { resolve(value: readonly string[]): void; reject(error: unknown): void }[] = [];
  let idle = 0;
  const batcher = new Batcher<string, string>({
    maxSize: options.maxSize ?? 64,
    ...(options.admits && { admits: options.admits }),
    onIdle: () => idle++,
    send: (items) => {
      sent.push([...items]);
      return new Promise((resolve, reject) => answers.push({ resolve, reject }));
    },
  });
  /** Waits until `n` batches have been sent. */
  const sentCount = async (n: number) => {
    while (sent.length < n) await new Promise((resolve) => setImmediate(resolve));
  };
  return { batcher, sent, answers, sentCount, idleCalls: () => idle };
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
    expect(batcher.idle).toBe(true);
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
    const batcher = new Batcher<string, string>({
      maxSize: 8,
      isolates: (error) => error instanceof RangeError,
      send: async (items) => {
        sent.push([...items]);
        if (items.includes('bad')) throw new RangeError('bad value');
        return items.map((item) => item.toUpperCase());
      },
    });
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

  test('an item a batch does not admit waits for the next one, keeping its place', async () => {
    // At most one item per letter, as releases hold at most one request per machine.
    const { batcher, sent, answers, sentCount } = manual({
      admits: (batch, item) => !batch.some((other) => other[0] === item[0]),
    });
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
    const batcher = new Batcher<string, string>({
      maxSize: 8,
      send: () => {
        gate.resolve();
        throw new Error('cannot send');
      },
    });
    const result = batcher.submit('a');
    await gate.promise;
    await expect(result).rejects.toThrow('cannot send');
  });
});
