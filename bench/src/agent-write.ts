/**
 * `npm run agent-write -w bench`: the real agent's disk-image write
 * (`@bmaas/agent`'s `writeDiskImage`: everything but the first MiB, the
 * sha256 checked, then the first MiB, then a flush) from an HTTP server on
 * loopback sending at full speed, to a file in the system's temporary
 * directory standing in for the disk. Random bytes, plain and gzip (level 1).
 * Prints, per image, the write rate (bytes written a second, from the
 * request's start to the flush) with the load average beside it; each row
 * is the median of BENCH_WRITE_ROUNDS (default 3) rounds, rows alternated.
 *
 * Environment: BENCH_WRITE_MIB (comma-separated image sizes, default
 * 64,256), BENCH_WRITE_ROUNDS.
 */

import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm, truncate, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { writeDiskImage } from '@bmaas/agent';

const SIZES_MIB = (process.env.BENCH_WRITE_MIB ?? '64,256').split(',').map(Number);
const ROUNDS = Number(process.env.BENCH_WRITE_ROUNDS ?? 3);

interface Image {
  readonly name: string;
  readonly body: Buffer;
  readonly bytes: number;
  readonly compression: 'none' | 'gzip';
}

const images: Image[] = SIZES_MIB.flatMap((mib) => {
  const raw = randomBytes(mib * 1024 * 1024);
  return [
    { name: `${mib} MiB`, body: raw, bytes: raw.length, compression: 'none' as const },
    { name: `${mib} MiB`, body: gzipSync(raw, { level: 1 }), bytes: raw.length, compression: 'gzip' as const },
  ];
});

const server: Server = createServer((req, res) => {
  const image = images[Number(new URL(req.url ?? '/', 'http://x').searchParams.get('i'))];
  if (!image) {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { 'content-length': image.body.length }).end(image.body);
});
await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
const port = (server.address() as { port: number }).port;
const dir = await mkdtemp(path.join(tmpdir(), 'bench-agent-write-'));

const rates: number[][] = images.map(() => []);
const loads: string[][] = images.map(() => []);
try {
  for (let round = 0; round < ROUNDS; round++) {
    for (const [i, image] of images.entries()) {
      const disk = path.join(dir, 'disk');
      await writeFile(disk, '');
      await truncate(disk, image.bytes + 4 * 1024 * 1024);
      const sha256 = createHash('sha256').update(image.body).digest('hex');
      const started = performance.now();
      await writeDiskImage({ url: `http://127.0.0.1:${port}/?i=${i}`, sha256, compression: image.compression }, disk);
      const seconds = (performance.now() - started) / 1000;
      rates[i]?.push(image.bytes / 1e6 / seconds);
      loads[i]?.push(loadavg()[0]?.toFixed(2) ?? '?');
      await rm(disk);
    }
  }
} finally {
  server.close();
  await rm(dir, { recursive: true, force: true });
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0;
console.log(
  `**Agent write** (\`writeDiskImage\`, ${ROUNDS} rounds, rows alternated): MB/s from the request's start to the flush, median (min–max), and the 1-minute load average after each round.`,
);
console.log('| image | compression | agent write MB/s | load average |');
console.log('|---:|---|---:|---|');
for (const [i, image] of images.entries()) {
  const r = rates[i] ?? [];
  console.log(
    `| ${image.name} | ${image.compression} | ${median(r).toFixed(1)} (${Math.min(...r).toFixed(1)}–${Math.max(...r).toFixed(1)}) | ${(loads[i] ?? []).join(', ')} |`,
  );
}
