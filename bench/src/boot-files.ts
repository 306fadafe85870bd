/**
 * `npm run boot-files -w bench`: the shepherd's boot files (`AgentBootFiles`)
 * serving a boot's ISO as BMCs read virtual media: in sequential ranges of a
 * fixed size over one kept-alive connection per reader, and whole, over plain
 * HTTP and TLS on loopback. The ISO is made here with xorriso (random bytes in
 * it, BENCH_BOOT_ISO_MIB, default 64), prepared as one machine's boot, and read
 * by 1 and 4 readers at once. Prints MB/s read (all readers together), the
 * median of BENCH_BOOT_ROUNDS (default 3) rounds with rows alternated, with the
 * 1-minute load average after each round; and what a prepare took (the ISO
 * copied with its config, by xorriso). The floor: a bare Node HTTP server
 * answering the same ranges from memory, what HTTP on this machine costs
 * without a file.
 */

import { execFile } from 'node:child_process';
import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, Agent as HttpAgent, request as httpRequest } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { BMDB } from '@bmaas/bmdb-controlloop';
import { certificatePem, Secret, selfSignedCertificate } from '@bmaas/common';
import { AgentBootFiles } from '@bmaas/shepherd-manager';
import { BenchServer } from './server.js';

const ISO_MIB = Number(process.env.BENCH_BOOT_ISO_MIB ?? 64);
const ROUNDS = Number(process.env.BENCH_BOOT_ROUNDS ?? 3);
/** Range sizes a reader asks for; 0: the whole file in one GET. */
const CHUNKS = [64 * 1024, 1024 * 1024, 0];
const READERS = [1, 4];

const dir = await mkdtemp(path.join(tmpdir(), 'bench-boot-files-'));
const imageDir = path.join(dir, 'image');
const root = path.join(dir, 'iso-root');
await mkdir(path.join(root, 'boot'), { recursive: true });
await mkdir(imageDir);
await writeFile(path.join(root, 'boot', 'vmlinuz'), randomBytes(ISO_MIB * 1024 * 1024));
await writeFile(path.join(root, 'boot', 'config.cpio'), '');
await writeFile(path.join(imageDir, 'vmlinuz'), randomBytes(1024));
await writeFile(path.join(imageDir, 'initramfs'), randomBytes(1024));
await promisify(execFile)('xorriso', ['-as', 'mkisofs', '-quiet', '-o', path.join(imageDir, 'agent.iso'), '-R', root]);

const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const cert = certificatePem(selfSignedCertificate(privateKey, { commonName: 'bench', altNames: ['127.0.0.1'] }));
const key = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();

/** GETs `url` (a range of it when `range` is given) and returns the bytes received. */
function get(url: string, agent: HttpAgent, range?: string): Promise<{ size: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const send = url.startsWith('https:') ? httpsRequest : httpRequest;
    const request = send(url, { agent, ca: cert, headers: range ? { range } : {} }, (response) => {
      let bytes = 0;
      response.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
      });
      response.on('end', () => {
        const total =
          /\/(\d+)$/.exec(response.headers['content-range'] ?? '')?.[1] ?? response.headers['content-length'];
        if (response.statusCode !== 200 && response.statusCode !== 206)
          reject(new Error(`${url}: ${response.statusCode}`));
        else resolve({ size: Number(total), bytes });
      });
      response.on('error', reject);
    });
    request.on('error', reject);
    request.end();
  });
}

/** One reader's pass over the ISO, as a BMC's: sequential ranges of `chunk` bytes, or one GET. */
async function readIso(url: string, agent: HttpAgent, chunk: number): Promise<number> {
  if (chunk === 0) return (await get(url, agent)).bytes;
  let read = 0;
  for (let offset = 0, size = Number.POSITIVE_INFINITY; offset < size; offset += chunk) {
    const answer = await get(url, agent, `bytes=${offset}-${offset + chunk - 1}`);
    size = answer.size;
    read += answer.bytes;
  }
  return read;
}

/** The floor: ranges of the ISO from memory, parsed no further than the bench's own requests need. */
async function memoryServer(iso: Buffer): Promise<{ url: string; close(): void }> {
  const server = createServer((request, response) => {
    const [, first = '0', last = String(iso.length - 1)] = /bytes=(\d+)-(\d+)/.exec(request.headers.range ?? '') ?? [];
    const end = Math.min(Number(last), iso.length - 1);
    const body = iso.subarray(Number(first), end + 1);
    const headers = request.headers.range
      ? { 'content-length': body.length, 'content-range': `bytes ${first}-${end}/${iso.length}` }
      : { 'content-length': body.length };
    response.writeHead(request.headers.range ? 206 : 200, headers).end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}/agent.iso`, close: () => server.close() };
}

// The boot files answer network boots from the BMDB; virtual media, read here, needs none of its rows.
const database = await BenchServer.start();
const bmdb = await BMDB.open({
  url: await database.createDatabase('bench_boot_files'),
  migrate: true,
  componentName: 'bench',
  runtimeInfo: 'boot-files',
});
const transports = [
  {
    name: 'HTTP',
    files: await AgentBootFiles.start({ imageDir, db: bmdb.db, workDir: dir, listen: { host: '127.0.0.1', port: 0 } }),
  },
  {
    name: 'TLS',
    files: await AgentBootFiles.start({
      imageDir,
      db: bmdb.db,
      workDir: dir,
      listen: { host: '127.0.0.1', port: 0 },
      tls: { cert, key },
    }),
  },
];
const prepareMs: number[] = [];
let floor: { url: string; close(): void } | undefined;
const rows = [...transports, { name: 'floor' }].flatMap((transport) =>
  CHUNKS.flatMap((chunk) =>
    READERS.map((readers) => ({ transport, chunk, readers, rates: [] as number[], loads: [] as string[] })),
  ),
);
try {
  const isoUrls = new Map<string, string>();
  for (const transport of transports) {
    const machineId = randomUUID();
    const started = performance.now();
    const prepared = await transport.files.prepare({
      machineId,
      init: {
        $typeName: 'cloud.agent.api.TakeoverInit',
        machineId,
        bmaasEndpoint: 'bench:4443',
        caCertificate: new Uint8Array(),
      },
      token: new Secret(randomBytes(24).toString('base64url')),
    });
    prepareMs.push(performance.now() - started);
    isoUrls.set(transport.name, prepared.isoUrl);
  }
  floor = await memoryServer(await readFile(path.join(imageDir, 'agent.iso')));
  isoUrls.set('floor', floor.url);
  for (let round = 0; round < ROUNDS; round++) {
    for (const row of rows) {
      const url = isoUrls.get(row.transport.name) ?? '';
      const agents = Array.from({ length: row.readers }, () =>
        url.startsWith('https:')
          ? new HttpsAgent({ keepAlive: true, maxSockets: 1 })
          : new HttpAgent({ keepAlive: true, maxSockets: 1 }),
      );
      const started = performance.now();
      const bytes = await Promise.all(agents.map((agent) => readIso(url, agent, row.chunk)));
      const seconds = (performance.now() - started) / 1000;
      for (const agent of agents) agent.destroy();
      row.rates.push(bytes.reduce((a, b) => a + b, 0) / 1e6 / seconds);
      row.loads.push(loadavg()[0]?.toFixed(2) ?? '?');
    }
  }
} finally {
  floor?.close();
  for (const transport of transports) await transport.files.close();
  await bmdb.close();
  await database.stop();
  await rm(dir, { recursive: true, force: true });
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0;
console.log(
  `**Boot files** (\`AgentBootFiles\`, a ${ISO_MIB} MiB boot ISO on loopback, ${ROUNDS} rounds, rows alternated): MB/s read by all readers together, median (min–max), and the 1-minute load average after each round. A prepare (the ISO copied with its config by xorriso) took ${prepareMs.map((ms) => `${ms.toFixed(0)} ms`).join(', ')}.`,
);
console.log('| served by | range size | readers | MB/s | load average |');
console.log('|---|---:|---:|---:|---|');
for (const row of rows) {
  const name =
    row.transport.name === 'floor' ? 'floor: bare HTTP from memory' : `AgentBootFiles, ${row.transport.name}`;
  const size = row.chunk === 0 ? 'whole file' : `${row.chunk / 1024} KiB`;
  const r = row.rates;
  console.log(
    `| ${name} | ${size} | ${row.readers} | ${median(r).toFixed(0)} (${Math.min(...r).toFixed(0)}–${Math.max(...r).toFixed(0)}) | ${row.loads.join(', ')} |`,
  );
}
