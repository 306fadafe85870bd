import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs and does what it says', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged[0]).toMatch(/^heartbeat of [0-9a-f-]{36} recorded$/);
  expect(logged[1]).toMatch(/^hardware report of \d+ bytes stored$/);
});
