import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { BMDB, parseLimiter } from '@bmaas/bmdb-controlloop';
import { RedfishClient, Secret, StaticProvider } from '@bmaas/provider-static';
import { FakeRedfishServer, selfSignedCertificate } from '@bmaas/provider-static/testing';
import { PowerSync } from '@bmaas/shepherd-manager';
import type { BenchServer } from './server.js';
import { UNBOUND_LIMITER } from './throughput.js';

/** One figure of the power sync: reads a second at a concurrency, beside the BMC requests alone. */
export interface PowerSyncFigure {
  readonly machines: number;
  readonly concurrency: number;
  /** Power states read and recorded a second by `PowerSync` (lease, HTTPS GET, record). */
  readonly syncPerSecond: number;
  /** The same GETs through the Redfish client alone, without the BMDB: the floor the BMC side sets. */
  readonly getsPerSecond: number;
  /** 1-minute load average before and after (other processes share the machine). */
  readonly loadAverage: readonly [number, number];
}

/**
 * The power sync's rate with its limiter out of the way: `machines` static
 * machines, each a system of one fake Redfish BMC over HTTPS on loopback,
 * read once each by `PowerSync` at each concurrency (the BMDB's leases and
 * records included), and the same reads by the Redfish client alone.
 */
export async function powerSyncRate(
  server: BenchServer,
  machines: number,
  concurrencies: readonly number[],
): Promise<PowerSyncFigure[]> {
  const name = `bench_power_${machines}`;
  const url = await server.createDatabase(name);
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-power-'));
  const certificate = await selfSignedCertificate();
  const bmc = await FakeRedfishServer.start({ tls: certificate });
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-power', runtimeInfo: 'bench' });
  const redfish = new RedfishClient({ ca: certificate.cert, concurrency: 1000, timeout: 10_000 });
  try {
    const ids = Array.from({ length: machines }, (_, i) => `node${i}`);
    const inventory = path.join(dir, 'inventory.json');
    await writeFile(
      inventory,
      JSON.stringify(
        ids.map((id, i) => ({
          id,
          address: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`,
          bmc: { url: bmc.addSystem(id), username: bmc.username, password: bmc.password },
        })),
      ),
    );
    await chmod(inventory, 0o600);
    await server.withClient(name, (client) =>
      client.query(
        `WITH m AS (INSERT INTO machines SELECT FROM generate_series(1, $1::int) RETURNING machine_id)
         INSERT INTO machine_provided (machine_id, provider, provider_id)
         SELECT machine_id, 'Static', 'node' || (row_number() OVER () - 1) FROM m`,
        [machines],
      ),
    );
    const provider = new StaticProvider({ inventory, redfish });
    const figures: PowerSyncFigure[] = [];
    for (const concurrency of concurrencies) {
      const loadBefore = loadavg()[0] ?? 0;
      await server.withClient(name, (client) => client.query('UPDATE machine_power_state SET power_checked_at = NULL'));
      const sync = new PowerSync(provider, {
        limiter: parseLimiter(UNBOUND_LIMITER),
        concurrency,
        interval: 3_600_000,
        idlePoll: 5,
      });
      const began = performance.now();
      let read = 0;
      const readers = Array.from({ length: concurrency }, async () => {
        while ((await sync.syncOne(bmdb)) !== undefined) read++;
      });
      await Promise.all(readers);
      const syncSeconds = (performance.now() - began) / 1000;

      const target = (id: string) => ({
        machine: id,
        url: bmc.systemUrl(id),
        username: bmc.username,
        password: new Secret(bmc.password),
      });
      let next = 0;
      const getsBegan = performance.now();
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (next < ids.length) await redfish.getSystem(target(ids[next++] as string));
        }),
      );
      const getsSeconds = (performance.now() - getsBegan) / 1000;
      const figure = {
        machines,
        concurrency,
        syncPerSecond: read / syncSeconds,
        getsPerSecond: ids.length / getsSeconds,
        loadAverage: [loadBefore, loadavg()[0] ?? 0] as const,
      };
      process.stderr.write(
        `[bench] power sync ${machines} machines ×${concurrency}: ${figure.syncPerSecond.toFixed(0)} reads/s ` +
          `(BMC GETs alone ${figure.getsPerSecond.toFixed(0)}/s), load ${figure.loadAverage.map((l) => l.toFixed(2)).join(' → ')}\n`,
      );
      figures.push(figure);
    }
    return figures;
  } finally {
    await bmdb.close();
    await redfish.close();
    await bmc.close();
    await rm(dir, { recursive: true, force: true });
    await server.dropDatabase(name);
  }
}
