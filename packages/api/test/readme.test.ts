import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged).toEqual([
    'cloud.agent.api.TakeoverInit for 3f2a6c1e-8d4b-4f6a-9c2e-1b7d5e9a0c3f at bmaas.example.net:8443',
  ]);
});
