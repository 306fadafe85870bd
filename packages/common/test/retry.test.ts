import { describe, expect, test } from 'vitest';
import { retry } from '../src/index.js';

class Passing extends Error {}

/** Records each attempt, failing the first `failures` with `error`. */
function flaky(failures: number, error: () => Error = () => new Passing('passing')) {
  const attempts: number[] = [];
  return {
    attempts,
    run: async (attempt: number) => {
      attempts.push(attempt);
      if (attempts.length <= failures) throw error();
      return `done on attempt ${attempt}`;
    },
  };
}

describe('retry', () => {
  test('retries a retryable failure until an attempt succeeds, numbering the attempts', async () => {
    const op = flaky(2);
    const retries: Array<[number, number]> = [];
    const result = await retry(op.run, {
      maxAttempts: 5,
      baseDelay: 1,
      retryable: (error) => error instanceof Passing,
      onRetry: (_error, attempt, pause) => retries.push([attempt, pause]),
    });
    expect(result).toBe('done on attempt 3');
    expect(op.attempts).toEqual([1, 2, 3]);
    expect(retries.map(([attempt]) => attempt)).toEqual([1, 2]);
  });

  test('throws a failure that is not retryable at once', async () => {
    const op = flaky(1, () => new Error('refused'));
    await expect(
      retry(op.run, { maxAttempts: 5, baseDelay: 1, retryable: (e) => e instanceof Passing }),
    ).rejects.toThrow('refused');
    expect(op.attempts).toEqual([1]);
  });

  test('throws the last failure after maxAttempts', async () => {
    let n = 0;
    const failure = retry(
      async () => {
        throw new Passing(`failure ${++n}`);
      },
      { maxAttempts: 3, baseDelay: 1, retryable: () => true },
    );
    await expect(failure).rejects.toThrow('failure 3');
  });

  test('pauses with equal jitter: between half and all of a doubling ceiling, bounded by maxDelay', async () => {
    const pauses: number[] = [];
    const op = flaky(6);
    await retry(op.run, {
      maxAttempts: 7,
      baseDelay: 8,
      maxDelay: 32,
      retryable: () => true,
      onRetry: (_error, _attempt, pause) => pauses.push(pause),
    });
    const ceilings = [8, 16, 32, 32, 32, 32];
    expect(pauses).toHaveLength(ceilings.length);
    pauses.forEach((pause, i) => {
      const ceiling = ceilings[i] ?? 0;
      expect(pause).toBeGreaterThanOrEqual(ceiling / 2);
      expect(pause).toBeLessThanOrEqual(ceiling);
    });
  });

  test('takes the pause a failure asks for instead of the backoff', async () => {
    const pauses: number[] = [];
    await retry(flaky(1).run, {
      maxAttempts: 2,
      baseDelay: 3_600_000,
      retryable: () => true,
      requestedPause: () => 5,
      onRetry: (_error, _attempt, pause) => pauses.push(pause),
    });
    expect(pauses).toEqual([5]);
  });

  test('a stop signal ends the retries with its reason, in the pause or after a failure', async () => {
    const controller = new AbortController();
    const reason = new Error('stopping');
    const pausing = retry(flaky(1).run, {
      maxAttempts: 2,
      baseDelay: 3_600_000,
      retryable: () => true,
      onRetry: () => controller.abort(reason),
      signal: controller.signal,
    });
    await expect(pausing).rejects.toBe(reason);
    const op = flaky(1);
    await expect(
      retry(op.run, { maxAttempts: 5, baseDelay: 1, retryable: () => true, signal: controller.signal }),
    ).rejects.toBe(reason);
    expect(op.attempts).toEqual([1]);
  });
});
