import { describe, expect, test } from 'vitest';
import { nextBackoffSeconds, normalizeBackoff } from '../src/backoff.js';
import type { Backoff } from '../src/index.js';

const second = 1000;
const minute = 60 * second;

/** Intervals of `count` consecutive failures, starting from `previous`. */
function intervals(backoff: Backoff | undefined, count: number, previous?: number): number[] {
  const out: number[] = [];
  let last = previous;
  for (let i = 0; i < count; i++) {
    last = nextBackoffSeconds(backoff, last);
    out.push(last);
  }
  return out;
}

describe('Backoff', () => {
  test('grows by the exponent, rounding up to whole seconds, up to the maximum', () => {
    expect(intervals({ initial: minute, maximum: 2 * minute, exponent: 1.1 }, 9)).toEqual([
      60, 66, 73, 81, 90, 99, 109, 120, 120,
    ]);
  });

  test('continues from a previous interval below the initial one', () => {
    expect(intervals({ initial: minute, maximum: 2 * minute, exponent: 2 }, 6, 2)).toEqual([4, 8, 16, 32, 64, 120]);
  });

  test('exponent 1 is a constant interval of initial', () => {
    expect(intervals({ initial: 5 * second, maximum: minute, exponent: 1 }, 3, 30)).toEqual([5, 5, 5]);
  });

  test('no backoff repeats the previous interval, or 1 s without one', () => {
    expect(nextBackoffSeconds(undefined, undefined)).toBe(1);
    expect(nextBackoffSeconds(undefined, 42)).toBe(42);
  });

  test('the first failure waits initial', () => {
    expect(nextBackoffSeconds({ initial: 5 * minute, maximum: 4 * 60 * minute, exponent: 1.2 }, undefined)).toBe(300);
  });

  test('clamps exponent < 1 to 1, initial < 1 s to 1 s, maximum < initial to initial', () => {
    expect(normalizeBackoff({ initial: 10, maximum: 0, exponent: 0.5 })).toEqual({
      initial: second,
      maximum: second,
      exponent: 1,
    });
    expect(normalizeBackoff({ initial: 10 * second, maximum: 5 * second, exponent: 2 })).toEqual({
      initial: 10 * second,
      maximum: 10 * second,
      exponent: 2,
    });
    // A clamped maximum caps the growth.
    expect(intervals({ initial: 10 * second, maximum: 5 * second, exponent: 2 }, 3)).toEqual([10, 10, 10]);
  });
});
