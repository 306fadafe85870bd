import { execFile } from 'node:child_process';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { expect, test } from 'vitest';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../../..', import.meta.url));

// A whole `npm ci`, minutes: in CI (.ci/run sets CI=true), or asked for with TEST_FRESH_CLONE=1.
const wanted = process.env.CI === 'true' || process.env.TEST_FRESH_CLONE === '1';

test.runIf(wanted)(
  'in a fresh clone of the committed tree, npx shepherd works right after npm ci, agent-image build included',
  async () => {
    const clone = await mkdtemp(path.join(tmpdir(), 'shepherd-clone-'));
    try {
      await run('git', ['clone', '--quiet', root, clone]);
      await run('npm', ['ci', '--no-audit', '--no-fund'], { cwd: clone, maxBuffer: 64 << 20 });
      const { stdout } = await run('npx', ['shepherd', '--help'], { cwd: clone });
      expect(stdout).toContain('shepherd run <provider>');
      // Step 1 of the README's "Running on your own machines": the agent image, with the bundle npm ci made.
      const out = path.join(clone, 'agent-image');
      const image = await run(
        'npx',
        ['shepherd', 'agent-image', 'build', '--out', out, '--cache-dir', path.join(clone, 'cache')],
        { cwd: clone },
      );
      expect(image.stdout).toContain(`${path.join(out, 'takeover')} (`);
      expect((await stat(path.join(out, 'agent.iso'))).size).toBeGreaterThan(0);
    } finally {
      await rm(clone, { recursive: true, force: true });
    }
  },
  900_000,
);
