import { sleep } from '@bmaas/common';
import pg from 'pg';

/**
 * Resolves once a starting PostgreSQL server accepts connections at
 * `probeUrl`, trying every 50 ms: "the database system is starting up"
 * (57P03) or no listener yet mean wait. Throws what `exited` returns as soon
 * as the server process is gone, and the last connection error once
 * `timeout` ms have passed.
 */
export async function waitUntilAccepting(
  probeUrl: string,
  options: { readonly timeout: number; readonly exited: () => Error | undefined },
): Promise<void> {
  const deadline = Date.now() + options.timeout;
  for (;;) {
    const exited = options.exited();
    if (exited !== undefined) throw exited;
    const client = new pg.Client({ connectionString: probeUrl, connectionTimeoutMillis: 1_000 });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.end();
      return;
    } catch (error) {
      await client.end().catch(() => {});
      if (Date.now() > deadline)
        throw new Error(
          `postgres did not accept connections within ${options.timeout / 1000}s: ${(error as Error).message}`,
          { cause: error },
        );
    }
    await sleep(50);
  }
}
