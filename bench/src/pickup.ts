import { BMDB, type ControlLoop, parseLimiter, runControlLoop } from '@bmaas/bmdb-controlloop';
import { agentStartSelection, Process, type ProvidedMachine, setAgentStarted } from '@bmaas/bmdb-model';
import { PROVIDER } from './fleet.js';
import type { BenchServer } from './server.js';

const PUBLIC_KEY = new Uint8Array(32);

/**
 * Milliseconds from a machine becoming eligible (the statement that provides
 * it is sent) to an idle worker's `processMachine` receiving it, at default
 * settings: one worker, `250ms,8`, default idle delay and session interval.
 * Between samples the worker idles for a random 0.3–1.0 s.
 */
export async function pickupLatency(server: BenchServer, samples: number): Promise<number[]> {
  const name = 'bench_pickup';
  const url = await server.createDatabase(name);
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-pickup', runtimeInfo: 'bench' });
  const stop = new AbortController();
  const arrivals = new Map<string, (at: number) => void>();
  try {
    const loop: ControlLoop<ProvidedMachine> = {
      process: Process.ShepherdAgentStart,
      processor: 'bench-pickup',
      defaultBackoff: { initial: 60_000, maximum: 60_000, exponent: 1 },
      selectMachines: (q) => agentStartSelection(q, { provider: PROVIDER }),
      async processMachine({ candidate, work }) {
        arrivals.get(candidate.providerId)?.(performance.now());
        await work.finish((q) => setAgentStarted(q, candidate.machineId, { publicKey: PUBLIC_KEY }));
      },
    };
    const running = runControlLoop(bmdb, loop, { claimLimiter: parseLimiter('250ms,8'), signal: stop.signal });
    const latencies: number[] = [];
    await server.withClient(name, async (client) => {
      for (let i = 0; i < samples; i++) {
        await new Promise((resolve) => setTimeout(resolve, 300 + Math.random() * 700));
        const providerId = `pickup-${i}`;
        const arrived = new Promise<number>((resolve) => arrivals.set(providerId, resolve));
        const sentAt = performance.now();
        await client.query(
          `WITH m AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id)
           INSERT INTO machine_provided (machine_id, provider, provider_id) SELECT machine_id, $1, $2 FROM m`,
          [PROVIDER, providerId],
        );
        latencies.push((await arrived) - sentAt);
      }
    });
    stop.abort();
    await running;
    return latencies;
  } finally {
    stop.abort();
    await bmdb.close();
    await server.dropDatabase(name);
  }
}
