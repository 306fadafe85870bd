/**
 * `npm run agent-image -w bench`: `buildAgentImage` (what `shepherd
 * agent-image build` runs) from this machine's Debian packages, cold (an
 * empty cache directory: modules read and hashed, the initramfs gzipped, the
 * ISO made) then warm (the same inputs, the parts copied from the cache), for
 * BENCH_IMAGE_ROUNDS rounds (default 2). Prints a table with the seconds,
 * the compressed initramfs, ISO and takeover payload, the modules and
 * firmware carried, and the 1-minute load average before and after each
 * build; writes it to results/latest-agent-image.md.
 *
 * Environment: BENCH_IMAGE_ROUNDS, BENCH_FIRMWARE_DIR (default /lib/firmware).
 */

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildAgentImage } from '@bmaas/agent';

const ROUNDS = Number(process.env.BENCH_IMAGE_ROUNDS ?? 2);
const firmwareDir = process.env.BENCH_FIRMWARE_DIR ?? '/lib/firmware';
const agentBundle = fileURLToPath(new URL('../../packages/agent/dist/agent.cjs', import.meta.url));
const results = fileURLToPath(new URL('../results/', import.meta.url));

const load = () => loadavg()[0]?.toFixed(1) ?? '?';
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1);
const rows: string[] = [];
const dir = await mkdtemp(path.join(tmpdir(), 'bench-agent-image-'));
try {
  for (let round = 1; round <= ROUNDS; round++) {
    const cacheDir = path.join(dir, `cache-${round}`);
    for (const kind of ['cold', 'warm'] as const) {
      const before = load();
      const started = performance.now();
      const image = await buildAgentImage({ out: path.join(dir, `out-${round}`), cacheDir, agentBundle, firmwareDir });
      const seconds = (performance.now() - started) / 1000;
      rows.push(
        `| ${round} | ${kind} | ${seconds.toFixed(1)} | ${mib(image.initramfsBytes)} | ${mib(image.isoBytes)} | ${mib(image.takeoverBytes)} | ${image.modules.length} | ${image.firmware.length} found, ${image.missingFirmware.length} missing | ${before} → ${load()} |`,
      );
      console.log(rows.at(-1));
    }
    await rm(cacheDir, { recursive: true, force: true });
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}

const report = [
  `**Agent image build** (\`buildAgentImage\`, what \`shepherd agent-image build\` runs; ${ROUNDS} rounds, each cold on an empty cache, then warm; firmware from ${firmwareDir}): seconds, sizes in MiB (the initramfs gzip-compressed), and the 1-minute load average before and after each build.`,
  '',
  '| round | cache | seconds | initramfs MiB | ISO MiB | takeover MiB | modules | firmware | load average |',
  '|---:|---|---:|---:|---:|---:|---:|---|---|',
  ...rows,
].join('\n');
console.log(`\n${report}`);
await writeFile(path.join(results, 'latest-agent-image.md'), `${report}\n`);
