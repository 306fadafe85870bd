import { describe, expect, test } from 'vitest';
import { formatDuration } from '../src/duration.js';
import { InvalidSettingError, parseDuration, parseLimiter, RateLimiter } from '../src/index.js';

describe('parseDuration', () => {
  test.each([
    ['0', 0],
    ['250ms', 250],
    ['1.5s', 1500],
    ['2m', 120_000],
    ['1h30m', 5_400_000],
    ['1m0.5s', 60_500],
    ['500us', 0.5],
    ['3000ns', 0.003],
  ])('%s is %d ms', (text, ms) => {
    expect(parseDuration(text)).toBeCloseTo(ms, 9);
  });

  test.each(['', '5', 'ms', '-1s', '1d', '1.2.3s', '10 s', 'abc'])('rejects %j naming the value', (text) => {
    expect(() => parseDuration(text)).toThrow(InvalidSettingError);
    expect(() => parseDuration(text)).toThrow(JSON.stringify(text));
  });

  test('formats like Go', () => {
    expect(formatDuration(250)).toBe('250ms');
    expect(formatDuration(90_000)).toBe('1m30s');
    expect(formatDuration(3_600_000)).toBe('1h0m0s');
    expect(parseDuration(formatDuration(5_400_500))).toBe(5_400_500);
  });
});

describe('parseLimiter', () => {
  test('reads duration and bucket size', () => {
    const limiter = parseLimiter('250ms,8');
    expect(limiter.every).toBe(250);
    expect(limiter.burst).toBe(8);
    expect(limiter.spec).toBe('250ms,8');
  });

  test.each([
    '250ms',
    '250ms,8,1',
    'fast,8',
    '0s,8',
    '250ms,0',
    '250ms,-1',
    '250ms,1.5',
    '250ms,x',
    ',8',
    '1m,3000000000',
  ])('rejects %j with the value and the expected syntax', (spec) => {
    let error: unknown;
    try {
      parseLimiter(spec);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidSettingError);
    expect((error as Error).message).toContain(JSON.stringify(spec));
    expect((error as Error).message).toContain("'duration,count'");
  });
});

describe('RateLimiter', () => {
  test('starts with a full bucket', () => {
    const limiter = new RateLimiter(60_000, 3);
    expect([limiter.tryTake(), limiter.tryTake(), limiter.tryTake(), limiter.tryTake()]).toEqual([
      true,
      true,
      true,
      false,
    ]);
  });

  test('wait() takes a refilled token', async () => {
    const limiter = parseLimiter('20ms,1');
    expect(limiter.tryTake()).toBe(true);
    expect(limiter.tryTake()).toBe(false);
    await limiter.wait();
    expect(limiter.tryTake()).toBe(false);
  });

  test('wait() rejects with the abort reason as soon as the signal aborts', async () => {
    const limiter = parseLimiter('1h,1');
    limiter.tryTake();
    const controller = new AbortController();
    const waiting = limiter.wait(controller.signal);
    const reason = new Error('stopping');
    controller.abort(reason);
    await expect(waiting).rejects.toBe(reason);
    // An already aborted signal rejects at once.
    await expect(limiter.wait(controller.signal)).rejects.toBe(reason);
  });

  test('rejects a bad bucket or interval in the constructor', () => {
    expect(() => new RateLimiter(0, 1)).toThrow(RangeError);
    expect(() => new RateLimiter(10, 0)).toThrow(/bucket size/);
  });
});
