import { expect, test } from 'vitest';
import { isUuid } from '../src/index.js';

test('isUuid takes a UUID in its usual form, in either case, and nothing else', () => {
  expect(isUuid('6f1c2a9e-3b4d-4e5f-8a9b-0c1d2e3f4a5b')).toBe(true);
  expect(isUuid('6F1C2A9E-3B4D-4E5F-8A9B-0C1D2E3F4A5B')).toBe(true);
  expect(isUuid('6f1c2a9e3b4d4e5f8a9b0c1d2e3f4a5b')).toBe(false);
  expect(isUuid(' 6f1c2a9e-3b4d-4e5f-8a9b-0c1d2e3f4a5b')).toBe(false);
  expect(isUuid('6f1c2a9e-3b4d-4e5f-8a9b-0c1d2e3f4a5g')).toBe(false);
  expect(isUuid('node07')).toBe(false);
  expect(isUuid('')).toBe(false);
});
