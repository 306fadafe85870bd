import { describe, expect, test } from 'vitest';
import { isAbortError, isAbortOf, isStop } from '../src/index.js';

describe('telling a stop from a failure', () => {
  test('isAbortOf is true only for the aborted signal’s own reason', () => {
    const controller = new AbortController();
    const reason = new Error('stop');
    expect(isAbortOf(reason, controller.signal)).toBe(false); // not aborted yet
    controller.abort(reason);
    expect(isAbortOf(reason, controller.signal)).toBe(true);
    expect(isAbortOf(new Error('stop'), controller.signal)).toBe(false);
    expect(isAbortOf(reason, undefined)).toBe(false);
  });

  test('isAbortError is true for any AbortError, not for a TimeoutError or a failure', () => {
    expect(isAbortError(new DOMException('aborted', 'AbortError'))).toBe(true);
    expect(isAbortError(new DOMException('timed out', 'TimeoutError'))).toBe(false);
    expect(isAbortError(new Error('ECONNREFUSED'))).toBe(false);
    expect(isAbortError('AbortError')).toBe(false);
  });

  test('isStop, the loops’ test, also counts a timeout as a stop', () => {
    const controller = new AbortController();
    controller.abort();
    expect(isStop(controller.signal.reason, controller.signal)).toBe(true);
    expect(isStop(new DOMException('timed out', 'TimeoutError'))).toBe(true);
    expect(isStop(new Error('ECONNREFUSED'), controller.signal)).toBe(false);
  });
});
