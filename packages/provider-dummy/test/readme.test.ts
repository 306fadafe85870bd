import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs', async () => {
  const logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  expect(logged.length).toBeGreaterThan(0);
  expect(logged[0]).toContain('dummy-000000 10.0.0.1 PossiblyUsed');
  expect(logged[1]).toMatch(/^[0-3] of 3 agents heartbeat$/);
  const stages = JSON.parse(logged.at(-1) ?? '{}');
  expect(stages.heartbeating + stages.agentStarted).toBe(3);
});
