import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);
const root = fileURLToPath(new URL('../../', import.meta.url));
/** The .proto files and their buf configuration. */
const protoDir = path.join(root, 'proto');
/** As under `npm run generate -w proto`: buf and protoc-gen-es from the workspace. */
const env = { ...process.env, PATH: `${path.join(root, 'node_modules/.bin')}${path.delimiter}${process.env.PATH}` };

/** Runs the workspace's buf in proto/. */
export async function buf(args: readonly string[]): Promise<void> {
  await execFileAsync('buf', [...args], { cwd: protoDir, env });
}

/**
 * The code buf generates from proto/ now with `template`, and the code
 * committed at `genDir` (relative to the repository), each as file → text.
 * The fresh code goes to a scratch directory: `-o` re-roots the template's
 * `out` under it, leaving the tree alone.
 */
export async function generatedAndCommitted(
  template: string,
  genDir: string,
): Promise<{ fresh: Map<string, string>; committed: Map<string, string> }> {
  const scratch = await mkdtemp(path.join(tmpdir(), 'proto-generated-'));
  try {
    await buf(['generate', '--template', template, '-o', path.join(scratch, 'proto')]);
    return {
      fresh: await filesUnder(path.join(scratch, genDir)),
      committed: await filesUnder(path.join(root, genDir)),
    };
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

async function filesUnder(dir: string): Promise<Map<string, string>> {
  const files = new Map<string, string>();
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const file = path.join(entry.parentPath, entry.name);
    files.set(path.relative(dir, file), await readFile(file, 'utf8'));
  }
  return files;
}
