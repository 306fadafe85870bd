import { BMDB, type ControlLoop, parseLimiter, runControlLoop } from '@bmaas/bmdb-controlloop';
import { agentStartSelection, Process, type ProvidedMachine } from '@bmaas/bmdb-model';
import { PROVIDER } from './fleet.js';
import type { BenchServer } from './server.js';

/**
 * Statements per second per worker that a fully idle control loop sends at
 * default settings (`250ms,8`, default idle delay and session interval),
 * counted by pg_stat_statements (BEGIN and COMMIT included) over `durationMs`
 * after a warm-up that lets the idle delay grow to its maximum.
 */
export async function idleCost(server: BenchServer, workers: number, durationMs: number): Promise<number> {
  const name = 'bench_idle';
  const url = await server.createDatabase(name);
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-idle', runtimeInfo: 'bench' });
  const stop = new AbortController();
  try {
    const loop: ControlLoop<ProvidedMachine> = {
      process: Process.ShepherdAgentStart,
      processor: 'bench-idle',
      defaultBackoff: { initial: 60_000, maximum: 60_000, exponent: 1 },
      selectMachines: (q) => agentStartSelection(q, { provider: PROVIDER }),
      processMachine: async () => {
        throw new Error('an idle loop has nothing to process');
      },
    };
    const running = runControlLoop(bmdb, loop, {
      parallelism: workers,
      claimLimiter: parseLimiter('250ms,8'),
      signal: stop.signal,
    });
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    const statements = () =>
      server.withClient('postgres', async (client) => {
        const { rows } = await client.query<{ n: string | null }>(
          `SELECT sum(calls)::text AS n FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
           WHERE d.datname = $1`,
          [name],
        );
        return Number(rows[0]?.n ?? 0);
      });
    const before = await statements();
    const start = performance.now();
    await new Promise((resolve) => setTimeout(resolve, durationMs));
    const after = await statements();
    const elapsed = performance.now() - start;
    stop.abort();
    await running;
    return (after - before) / (elapsed / 1000) / workers;
  } finally {
    stop.abort();
    await bmdb.close();
    await server.dropDatabase(name);
  }
}
