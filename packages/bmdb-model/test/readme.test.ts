import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs and does what it says', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged.filter((line) => line.startsWith('agent started on')).sort()).toEqual([
    'agent started on example-0',
    'agent started on example-1',
    'agent started on example-2',
  ]);
  expect(JSON.parse(logged.at(-1) ?? '{}')).toMatchObject({ provided: 0, agentStarted: 3 });
});
