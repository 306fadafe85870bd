/** The guest kernel is found, newest first, only with its modules; without one the error names the Debian package. */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { findKernel, LabSetupError } from '../src/index.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'lab-kernel-'));
  await mkdir(path.join(dir, 'boot'));
  await mkdir(path.join(dir, 'modules'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

test('no kernel with its modules: one error naming linux-image-amd64', async () => {
  await writeFile(path.join(dir, 'boot', 'vmlinuz-6.1.0-9-amd64'), 'kernel');
  expect(() => findKernel(path.join(dir, 'boot'), path.join(dir, 'modules'))).toThrow(LabSetupError);
  expect(() => findKernel(path.join(dir, 'boot'), path.join(dir, 'modules'))).toThrow(
    "install Debian's linux-image-amd64 package (apt-get install linux-image-amd64)",
  );
});

test('the newest kernel whose modules are installed', async () => {
  for (const release of ['6.1.0-9-amd64', '6.1.0-10-amd64', '6.1.0-11-amd64']) {
    await writeFile(path.join(dir, 'boot', `vmlinuz-${release}`), 'kernel');
  }
  for (const release of ['6.1.0-9-amd64', '6.1.0-10-amd64']) {
    await mkdir(path.join(dir, 'modules', release), { recursive: true });
    await writeFile(path.join(dir, 'modules', release, 'modules.dep'), '');
  }
  // 6.1.0-11 has no modules; 6.1.0-10 is newer than 6.1.0-9 (numeric order).
  expect(findKernel(path.join(dir, 'boot'), path.join(dir, 'modules'))).toEqual({
    release: '6.1.0-10-amd64',
    image: path.join(dir, 'boot', 'vmlinuz-6.1.0-10-amd64'),
    modules: path.join(dir, 'modules', '6.1.0-10-amd64'),
  });
});
