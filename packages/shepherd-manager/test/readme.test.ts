import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged.length).toBeGreaterThan(0);
  expect(JSON.parse(logged.at(-1) ?? '{}')).toMatchObject({ provided: 0, agentStarted: 5 });
});
