import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example (a component with its own tags, migration and loop, on the core alone) runs', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged).toEqual(['installed: debian-12, ubuntu-24.04']);
});
