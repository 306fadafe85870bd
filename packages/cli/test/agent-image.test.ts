/**
 * `shepherd agent-image build` as a process: bad input exits 2 naming the
 * flag or the word, before anything is built; a build names the firmware its
 * drivers declare that the firmware directory lacks. (The build itself:
 * packages/agent/test/image.test.ts.)
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { findKernel } from '@bmaas/agent';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { buildOnce, shepherd } from './helpers.js';

let dir: string;
beforeAll(async () => {
  await buildOnce();
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
  [
    ['agent-image', 'build', '--out', 'OUT', '--firmware-dir', 'NOPE'],
    /^shepherd: --firmware-dir: ".*\/nope" is not a directory$/m,
  ],
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

test('a build lists, driver by driver, the declared firmware the firmware directory does not have', async () => {
  // bnx2x's first declared file is there; its others are listed, it is not.
  const { stdout: declared } = await promisify(execFile)('modinfo', [
    '-F',
    'firmware',
    '-k',
    findKernel().release,
    'bnx2x',
  ]);
  const [found, ...missing] = declared.split('\n').filter((line) => line !== '');
  const firmwareDir = path.join(dir, 'firmware');
  await mkdir(path.dirname(path.join(firmwareDir, found as string)), { recursive: true });
  await writeFile(path.join(firmwareDir, found as string), 'bnx2x firmware');
  const out = path.join(dir, 'image');
  const result = await shepherd([
    'agent-image',
    'build',
    '--out',
    out,
    '--firmware-dir',
    firmwareDir,
    // The agent tests' cache: a build of the same inputs there is reused.
    '--cache-dir',
    path.join(tmpdir(), 'bmaas-agent-image-test-cache'),
  ]);
  expect(result.stderr).not.toMatch(/error/i);
  expect(result.code).toBe(0);
  expect(result.stdout).toMatch(new RegExp(`^\\d+ kernel modules, 1 firmware files from ${firmwareDir}$`, 'm'));
  expect(result.stdout).toMatch(new RegExp(`^firmware declared by \\d+ drivers not found in ${firmwareDir} `, 'm'));
  expect(result.stdout).toContain(`\n  bnx2x: ${missing.join(' ')}\n`);
  expect(result.stdout).not.toContain(`${found} `);
}, 300_000);
