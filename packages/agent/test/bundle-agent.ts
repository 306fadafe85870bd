import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const packageDir = fileURLToPath(new URL('..', import.meta.url));

/**
 * Bundles the agent into `outfile` as `npm run bundle` does into
 * `dist/agent.cjs`: a test's own bundle, so that the bundle test writing
 * `dist/` alongside is not raced.
 */
export async function bundleAgent(outfile: string): Promise<void> {
  await promisify(execFile)(
    'npx',
    [
      'esbuild',
      'bin/agent.js',
      '--bundle',
      '--platform=node',
      '--target=node20',
      '--format=cjs',
      `--outfile=${outfile}`,
      '--log-level=warning',
    ],
    { cwd: packageDir },
  );
}
