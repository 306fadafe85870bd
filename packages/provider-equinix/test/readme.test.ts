import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { runReadmeExample } from '../../../test/support/readme.js';

test('the README example runs and does what it says', async () => {
  const db = await createTestDatabase();
  const previous = process.env.BMDB_URL;
  process.env.BMDB_URL = db.url;
  let logged: string[];
  try {
    logged = await runReadmeExample(fileURLToPath(new URL('..', import.meta.url)));
  } finally {
    if (previous === undefined) delete process.env.BMDB_URL;
    else process.env.BMDB_URL = previous;
  }
  expect(logged.filter((line) => /^created demo-[0-9a-f-]{18} on reservation [0-9a-f-]{36}$/.test(line))).toHaveLength(
    3,
  );
  const statuses = logged.filter((line) => line.includes(': Running at '));
  expect(statuses).toHaveLength(3);
  for (const line of statuses) expect(line).toMatch(/^[0-9a-f-]{36}: Running at 198\.\d+\.\d+\.\d+ in da11$/);
});
