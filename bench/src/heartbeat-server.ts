/**
 * The BMaaS server of the heartbeat benchmark, in a process of its own:
 * `heartbeat-server.ts <BMDB URL> <data dir>` prints `{"port": N}` once it
 * listens, and stops on SIGTERM.
 */
import { BMDB } from '@bmaas/bmdb-controlloop';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { Registry } from 'prom-client';

const [url, dataDir] = process.argv.slice(2);
if (!url || !dataDir) throw new Error('usage: heartbeat-server.ts <BMDB URL> <data dir>');
const registry = new Registry();
const bmdb = await BMDB.open({
  url,
  migrate: true,
  componentName: 'bench-server',
  runtimeInfo: 'bench',
  metrics: registry,
});
const server = await BmaasServer.start({
  bmdb,
  listen: { host: '127.0.0.1', port: 0 },
  tls: await selfSignedServerTls(dataDir),
  metrics: registry,
});
process.stdout.write(`${JSON.stringify({ port: server.port })}\n`);
process.once('SIGTERM', async () => {
  await server.close();
  await bmdb.close();
  process.exit(0);
});
