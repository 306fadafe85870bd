import { fileURLToPath } from 'node:url';
import { expect, test } from 'vitest';
import { runReadmeExample } from '../../../test/support/readme.js';
import { missingForLab } from './support.js';

const packageDir = fileURLToPath(new URL('..', import.meta.url));
const missing = await missingForLab();

test.skipIf(missing.length > 0)(
  'the README example boots a VM and powers it off',
  async () => {
    const logged = await runReadmeExample(packageDir);
    expect(logged).toEqual(['the VM runs Linux from /boot', 'power: On', 'power: Off']);
  },
  300_000,
);
