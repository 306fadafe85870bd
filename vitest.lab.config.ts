import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/**
 * The lab's tests (packages/lab): QEMU VMs booting Debian's kernel, their
 * BMCs and the shepherd around them, about five minutes on two cores.
 * Kept out of `npm test` (vitest.config.ts) so the suite stays under ten
 * minutes; `npm run test:lab` runs them, and `.ci/run` right after
 * `npm test`, counting them in its closing line.
 */
export default defineConfig({
  ssr: { resolve: { conditions: ['source'] } },
  test: {
    globalSetup: [fileURLToPath(new URL('./test/global-setup.ts', import.meta.url))],
    testTimeout: 600_000,
    hookTimeout: 600_000,
    // One file at a time: each boots VMs, and two cores are all there is.
    fileParallelism: false,
    projects: [{ extends: true as const, test: { name: 'lab', root: 'packages/lab', include: ['test/**/*.test.ts'] } }],
  },
});
