import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';
import { LongestFirst } from './test/longest-first.js';

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
  // Outside node_modules, so the last run's file durations (LongestFirst's order) outlive `npm ci`.
  cacheDir: '.tmp/vite',
  test: {
    // Test files mostly wait: on PostgreSQL, on the processes they start (the CLI, sshd,
    // ipmi_sim) and on conditions they poll. Vitest's default, a worker per core but one,
    // ran them one at a time on two cores.
    maxWorkers: availableParallelism() * 2,
    sequence: { sequencer: LongestFirst },
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
