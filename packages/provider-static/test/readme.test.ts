import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { createTestDatabase } from '../../../test/support/database.js';
import { runReadmeExample } from '../../../test/support/readme.js';

const packageDir = fileURLToPath(new URL('..', import.meta.url));

test('the README example runs and does what it says', async () => {
  const db = await createTestDatabase();
  const logged = await runReadmeExample(packageDir, { env: { BMDB_URL: db.url } });
  expect(logged).toEqual([
    'provided rack1-node07, rack1-node08',
    'rack1-node07: BMC accepted ForceRestart',
    'resets seen by the BMC: node07 ForceRestart',
  ]);
  const { rows } = await db.admin(
    "SELECT provider_id, provider_ip_address, provider_location FROM machine_provided WHERE provider = 'Static' ORDER BY provider_id",
  );
  expect(rows).toEqual([
    { provider_id: 'rack1-node07', provider_ip_address: '192.0.2.7', provider_location: 'ams1' },
    { provider_id: 'rack1-node08', provider_ip_address: '192.0.2.8', provider_location: 'ams1' },
  ]);
});
