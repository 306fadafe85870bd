import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { AGENT_LOG_MAX_BYTES, readLogTail } from '../src/log-tail.js';

const dir = await mkdtemp(path.join(tmpdir(), 'log-tail-'));
afterAll(() => rm(dir, { recursive: true, force: true }));

test('a log within the bound is read whole; a missing one is undefined; an unchanged one is not read again', async () => {
  const file = path.join(dir, 'small.log');
  expect(await readLogTail(file)).toBeUndefined();
  await writeFile(file, 'one\n<script>two</script>\n');
  const tail = await readLogTail(file);
  expect(tail?.text).toBe('one\n<script>two</script>\n');
  expect(await readLogTail(file, tail?.version)).toBeUndefined();
  await writeFile(file, 'three\n', { flag: 'a' });
  expect((await readLogTail(file, tail?.version))?.text).toBe('one\n<script>two</script>\nthree\n');
});

test('a longer log is cut to its last whole lines within 64 KiB', async () => {
  const file = path.join(dir, 'long.log');
  const lines = Array.from({ length: 5000 }, (_, i) => `line ${i} ${'x'.repeat(20)}\n`);
  await writeFile(file, lines.join(''));
  const text = (await readLogTail(file))?.text ?? '';
  expect(Buffer.byteLength(text)).toBeLessThanOrEqual(AGENT_LOG_MAX_BYTES);
  expect(text.endsWith(lines[4999] ?? '')).toBe(true);
  expect(text.startsWith('line ')).toBe(true);
  expect(lines.join('').endsWith(text)).toBe(true);
  expect(Buffer.byteLength(text)).toBeGreaterThan(AGENT_LOG_MAX_BYTES - 40);
});

test('one line longer than the bound is cut at a whole character; NULs and bytes that are not UTF-8 keep it within', async () => {
  const file = path.join(dir, 'one-line.log');
  await writeFile(file, 'é'.repeat(AGENT_LOG_MAX_BYTES)); // 2 bytes each: the cut falls inside one at an odd offset.
  await writeFile(file, 'x', { flag: 'a' });
  const text = (await readLogTail(file))?.text ?? '';
  expect(text).toBe(`${'é'.repeat(AGENT_LOG_MAX_BYTES / 2 - 1)}x`);

  const binary = path.join(dir, 'binary.log');
  await writeFile(binary, Buffer.concat([Buffer.alloc(AGENT_LOG_MAX_BYTES, 0xff), Buffer.from('\0end\n')]));
  const cleaned = (await readLogTail(binary))?.text ?? '';
  expect(Buffer.byteLength(cleaned)).toBeLessThanOrEqual(AGENT_LOG_MAX_BYTES);
  expect(cleaned.endsWith('\uFFFDend\n')).toBe(true);
  expect(cleaned.includes('\0')).toBe(false);
});
