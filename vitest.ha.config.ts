import { defineConfig } from 'vitest/config';

/**
 * The failover tests (test/ha): etcd, three Patroni-managed PostgreSQL 15
 * nodes and HAProxy on loopback, whose leader is killed under whole shepherd
 * processes; each failover takes Patroni's ttl (30 s), so a few minutes in
 * all. Kept out of `npm test` (vitest.config.ts) for time: `npm run test:ha`
 * runs them, and `.ci/run` beside the lab's, counting them in its closing line.
 * They need no shared test database: the cluster is theirs.
 */
export default defineConfig({
  ssr: { resolve: { conditions: ['source'] } },
  test: {
    testTimeout: 360_000,
    hookTimeout: 180_000,
    // One file at a time: a cluster and its shepherds take both cores.
    fileParallelism: false,
    projects: [{ extends: true as const, test: { name: 'ha', root: 'test/ha', include: ['*.test.ts'] } }],
  },
});
