import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

/**
 * One Vitest project per package; tests run against sources (the `source`
 * export condition). The lab's (packages/lab: QEMU VMs) are in
 * vitest.lab.config.ts, run by `npm run test:lab` and by `.ci/run` after this.
 */
const packages = [
  'common',
  'api',
  'bmdb-controlloop',
  'bmdb-model',
  'shepherd-manager',
  'provider-dummy',
  'provider-equinix',
  'provider-static',
  'server',
  'web',
  'cli',
  'agent',
];

export default defineConfig({
  ssr: { resolve: { conditions: ['source'] } },
  test: {
    // Absolute: projects inherit it and resolve relative paths from their own root.
    globalSetup: [fileURLToPath(new URL('./test/global-setup.ts', import.meta.url))],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    projects: [
      ...packages.map((name) => ({
        extends: true as const,
        test: { name, root: `packages/${name}`, include: ['test/**/*.test.ts'] },
      })),
      // Whole shepherd processes under faults (test/chaos/README.md).
      { extends: true as const, test: { name: 'chaos', root: 'test/chaos', include: ['*.test.ts'] } },
      // The repository itself (ARCHITECTURE.md's references); needs no database.
      { test: { name: 'repo', root: '.', include: ['test/*.test.ts'] } },
    ],
  },
});
