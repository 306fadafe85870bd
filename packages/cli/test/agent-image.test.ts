/**
 * `shepherd agent-image build` as a process: bad input exits 2 naming the
 * flag or the word, before anything is built. (The build itself:
 * packages/agent/test/image.test.ts.)
 */
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { buildOnce, shepherd } from './helpers.js';

let dir: string;
beforeAll(async () => {
  buildOnce();
  dir = await mkdtemp(path.join(tmpdir(), 'cli-agent-image-'));
}, 120_000);
afterAll(() => rm(dir, { recursive: true, force: true }));

test.each([
  [['agent-image'], /^shepherd: agent-image: say what to do: build/m],
  [['agent-image', 'frob', '--out', 'OUT'], /^shepherd: agent-image: unknown command "frob": want build$/m],
  [['agent-image', 'build'], /^shepherd: --out: required for agent-image build \(or set SHEPHERD_OUT\)$/m],
  [['agent-image', 'build', '--out', 'OUT', '--bogus', '1'], /^shepherd: --bogus: unknown flag for agent-image/m],
  [
    ['agent-image', 'build', '--out', 'OUT', '--agent-bundle', 'NOPE'],
    /^shepherd: --agent-bundle: ".*\/nope" is not a file/m,
  ],
  [['agent-image', 'build', '--out', 'FILE'], /^shepherd: --out: ".*\/a-file" is not a directory$/m],
])('shepherd %j exits 2 naming what is wrong', async (args, message) => {
  const out = path.join(dir, 'out');
  const cacheDir = path.join(dir, 'cache');
  const file = path.join(dir, 'a-file');
  await rm(file, { force: true });
  await writeFile(file, 'not a directory');
  const resolved = args.map((arg) =>
    arg === 'OUT' ? out : arg === 'FILE' ? file : arg === 'NOPE' ? path.join(dir, 'nope') : arg,
  );
  const result = await shepherd([...resolved, '--cache-dir', cacheDir]);
  expect(result.code).toBe(2);
  expect(result.stderr).toMatch(message);
  // Nothing built, nothing written.
  await expect(stat(out)).rejects.toThrow(/ENOENT/);
  await expect(stat(cacheDir)).rejects.toThrow(/ENOENT/);
});
