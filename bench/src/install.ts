import { spawn } from 'node:child_process';
import { createHash, randomBytes, X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { newMachine, osInstallation, requestOSInstallation, setAgentStarted } from '@bmaas/bmdb-model';
import { BmaasServer, selfSignedServerTls } from '@bmaas/server';
import { encodeTakeoverInit, parseTakeoverResponse } from '@bmaas/shepherd-manager';
import type { BenchServer } from './server.js';

/** One OS installation through the test agent, from request to reported success. */
export interface InstallFigure {
  readonly imageMiB: number;
  readonly compression: 'none' | 'gzip';
  /** Bytes written to the disk a second by the agent, download to flush, as it logged. */
  readonly writeMBps: number;
  /** From the request to the stored `Succeeded` report, by the database's clock. */
  readonly requestToSuccessSeconds: number;
  readonly heartbeatIntervalMs: number;
  /** 1-minute load average after (other processes share the machine). */
  readonly loadAverage: number;
}

const TEST_AGENT = path.resolve(import.meta.dirname, '../../packages/shepherd-manager/bin/test-agent.js');
const HEARTBEAT_INTERVAL_MS = 1000;
const MiB = 1 << 20;

/**
 * The test agent installing images of `sizes` MiB, raw and gzipped, each by
 * a fresh agent (it stops after a success, as its machine reboots): a real
 * BMaaS server, an HTTPS image server on loopback sending at full speed, the
 * disk a file under the system's temporary directory, flushed.
 */
export async function installFigures(server: BenchServer, sizes: readonly number[]): Promise<InstallFigure[]> {
  const name = 'bench_install';
  const url = await server.createDatabase(name);
  const dir = await mkdtemp(path.join(tmpdir(), 'bench-install-'));
  const bmdb = await BMDB.open({ url, migrate: true, componentName: 'bench-install', runtimeInfo: 'bench' });
  const tls = await selfSignedServerTls(path.join(dir, 'tls'));
  const bmaas = await BmaasServer.start({ bmdb, listen: { host: '127.0.0.1', port: 0 }, tls });
  const images = new Map<string, Buffer>();
  const imageServer = createServer({ cert: tls.cert, key: tls.key }, (request, response) => {
    const image = images.get((request.url ?? '/').slice(1));
    if (image === undefined) response.writeHead(404).end();
    else response.writeHead(200, { 'content-length': image.length }).end(image);
  });
  await new Promise<void>((resolve) => imageServer.listen(0, '127.0.0.1', resolve));
  const q = bmdb.db;
  const figures: InstallFigure[] = [];
  try {
    for (const mib of sizes) {
      const raw = randomBytes(mib * MiB);
      for (const compression of ['none', 'gzip'] as const) {
        const bytes = compression === 'gzip' ? gzipSync(raw, { level: 1 }) : raw;
        const file = `image-${mib}.${compression}`;
        images.set(file, bytes);
        const machineId = await newMachine(q);
        const disk = path.join(dir, `${machineId}.disk`);
        await writeFile(disk, '');
        await truncate(disk, raw.length);
        const log = path.join(dir, `${machineId}.log`);
        const init = {
          machineId,
          bmaasEndpoint: `127.0.0.1:${bmaas.port}`,
          caCertificate: new Uint8Array(new X509Certificate(tls.cert).raw),
        };
        const answer = await takeover(encodeTakeoverInit(init), {
          SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL: `${HEARTBEAT_INTERVAL_MS}ms`,
          SHEPHERD_TEST_AGENT_LOG: log,
        });
        await setAgentStarted(q, machineId, { publicKey: parseTakeoverResponse(answer, init).key });
        const port = (imageServer.address() as AddressInfo).port;
        await requestOSInstallation(q, machineId, {
          imageUrl: `https://127.0.0.1:${port}/${file}`,
          imageSha256: createHash('sha256').update(bytes).digest('hex'),
          rootDevice: disk,
          compression,
          actor: 'bench',
          reason: 'bench',
        });
        const seconds = await succeeded(bmdb, machineId);
        const logged = /bytes written and flushed in [\d.]+ s \(([\d.]+) MB\/s\)/.exec(await readFile(log, 'utf8'));
        figures.push({
          imageMiB: mib,
          compression,
          writeMBps: Number(logged?.[1] ?? Number.NaN),
          requestToSuccessSeconds: seconds,
          heartbeatIntervalMs: HEARTBEAT_INTERVAL_MS,
          loadAverage: loadavg()[0] ?? 0,
        });
        images.delete(file);
        await rm(disk, { force: true });
      }
    }
  } finally {
    await new Promise<void>((resolve) => imageServer.close(() => resolve()));
    await bmaas.close();
    await bmdb.close();
    await rm(dir, { recursive: true, force: true });
  }
  return figures;
}

/** Runs the test agent's takeover; resolves with its answer once the command returned. */
function takeover(init: Uint8Array, env: Record<string, string>): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [TEST_AGENT], { stdio: 'pipe', env: { ...process.env, ...env } });
    const stdout: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(stdout)) : reject(new Error(`exit ${code}`))));
    child.stdin.end(init);
  });
}

/** Seconds from the request to its `Succeeded` report; throws on `Failed` or after ten minutes. */
async function succeeded(bmdb: BMDB, machineId: string): Promise<number> {
  const q = bmdb.db;
  for (const deadline = Date.now() + 600_000; Date.now() < deadline; ) {
    const installation = await osInstallation(q, machineId);
    if (installation?.state === 'Failed') throw new Error(`bench installation failed: ${installation.error}`);
    if (installation?.state === 'Succeeded' && installation.endedAt) {
      return (installation.endedAt.getTime() - installation.requestedAt.getTime()) / 1000;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  throw new Error(`bench installation of machine ${machineId} did not succeed within ten minutes`);
}
