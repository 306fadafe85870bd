import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs and reads this machine', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged[0]).toMatch(/^[1-9]\d* CPU package\(s\), \d+ disk\(s\), \d+ NIC\(s\)$/);
  expect(logged[1]).toMatch(/^report: [1-9]\d* hardware threads$/);
});
