import pg from 'pg';
import type { BenchServer } from './server.js';

/**
 * The server's own ceiling: `connections` clients each looping over two
 * single-row write transactions (insert a row, then update it), autocommit,
 * for `durationMs`. Returns transactions per second.
 */
export async function writeCeiling(server: BenchServer, connections: number, durationMs: number): Promise<number> {
  const name = 'bench_ceiling';
  const url = await server.createDatabase(name);
  try {
    await server.withClient(name, (client) =>
      client.query(
        'CREATE TABLE rows (id bigserial PRIMARY KEY, worker int NOT NULL, done boolean NOT NULL DEFAULT false)',
      ),
    );
    const clients = await Promise.all(
      Array.from({ length: connections }, async () => {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        return client;
      }),
    );
    let transactions = 0;
    const deadline = performance.now() + durationMs;
    const start = performance.now();
    await Promise.all(
      clients.map(async (client, worker) => {
        while (performance.now() < deadline) {
          const { rows } = await client.query<{ id: string }>('INSERT INTO rows (worker) VALUES ($1) RETURNING id', [
            worker,
          ]);
          await client.query('UPDATE rows SET done = true WHERE id = $1', [rows[0]?.id]);
          transactions += 2;
        }
      }),
    );
    const elapsed = performance.now() - start;
    await Promise.all(clients.map((client) => client.end()));
    return (transactions / elapsed) * 1000;
  } finally {
    await server.dropDatabase(name);
  }
}
