import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { HostKeyStoreError, JsonFileHostKeyPinStore, MemoryHostKeyPinStore } from '../src/index.js';

let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'host-key-pins-test-'));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe.each([
  ['MemoryHostKeyPinStore', () => new MemoryHostKeyPinStore()],
  ['JsonFileHostKeyPinStore', () => new JsonFileHostKeyPinStore(path.join(dir, `${Math.random()}`, 'pins.json'))],
])('%s', (_, createStore) => {
  test('keeps the first fingerprint pinned per ID until unpinned', async () => {
    const store = createStore();
    expect(await store.get('m1')).toBeUndefined();
    expect(await store.pin('m1', 'SHA256:first')).toBe('SHA256:first');
    expect(await store.pin('m1', 'SHA256:second')).toBe('SHA256:first');
    expect(await store.pin('m2', 'SHA256:second')).toBe('SHA256:second');
    await store.unpin('m1');
    expect(await store.get('m1')).toBeUndefined();
    expect(await store.pin('m1', 'SHA256:third')).toBe('SHA256:third');
  });

  test('concurrent pins of one ID agree on one winner', async () => {
    const store = createStore();
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => store.pin('m', `SHA256:${i}`)));
    expect(new Set(results)).toEqual(new Set(['SHA256:0']));
  });
});

describe('JsonFileHostKeyPinStore', () => {
  test('persists every pin, in a private file', async () => {
    const file = path.join(dir, 'persist', 'pins.json');
    const store = new JsonFileHostKeyPinStore(file);
    await Promise.all(Array.from({ length: 20 }, (_, i) => store.pin(`machine-${i}`, `SHA256:${i}`)));
    const reopened = new JsonFileHostKeyPinStore(file);
    for (let i = 0; i < 20; i++) expect(await reopened.get(`machine-${i}`)).toBe(`SHA256:${i}`);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
  });

  test.each([
    ['not JSON', '{"m": "SHA256:x"', /is not JSON/],
    ['an array', '["SHA256:x"]', /is not a JSON object/],
    ['a non-string pin', '{"m": 42}', /pin of "m" is not a fingerprint string/],
  ])('a file that is %s is a HostKeyStoreError naming it, and is left alone', async (_, contents, problem) => {
    const file = path.join(dir, `bad-${Math.random()}.json`);
    await writeFile(file, contents);
    const store = new JsonFileHostKeyPinStore(file);
    const error = await store.pin('m', 'SHA256:y').catch((e) => e);
    expect(error).toBeInstanceOf(HostKeyStoreError);
    expect(error.path).toBe(file);
    expect(error.message).toContain(file);
    expect(error.message).toMatch(problem);
    expect(await readFile(file, 'utf8')).toBe(contents);

    // Once repaired, the same store reads it again.
    await writeFile(file, '{"m": "SHA256:x"}');
    expect(await store.pin('m', 'SHA256:y')).toBe('SHA256:x');
  });
});
