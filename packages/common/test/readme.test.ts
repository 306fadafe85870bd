import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged).toEqual([
    'ok after 3 attempts',
    'slots held: 1',
    'stopped: true',
    'true false',
    '[redacted] {"password":"[redacted]"}',
    'DNS:localhost',
  ]);
});
