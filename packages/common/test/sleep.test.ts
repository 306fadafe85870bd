import { describe, expect, test } from 'vitest';
import { sleep } from '../src/index.js';

describe('sleep', () => {
  test('waits about the time asked', async () => {
    const started = performance.now();
    await sleep(50);
    expect(performance.now() - started).toBeGreaterThanOrEqual(45);
  });

  test('rejects with the abort reason as soon as the signal aborts, or at once if it already has', async () => {
    const controller = new AbortController();
    const sleeping = sleep(3_600_000, controller.signal);
    const reason = new Error('stopping');
    controller.abort(reason);
    await expect(sleeping).rejects.toBe(reason);
    await expect(sleep(3_600_000, controller.signal)).rejects.toBe(reason);
  });
});
