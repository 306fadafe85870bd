import { chmod, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';

/**
 * Runs the first ```ts block of a package README (or the first whose fence
 * reads ```ts <tag>, e.g. `runnable`) as a module, from inside the package
 * (so its imports resolve as a user's would), and returns what it logged.
 * Keeps the README's examples honest, and tidy: each runs with its own
 * temporary directory (TMPDIR), which must be empty afterwards. `env` holds
 * further variables for the example's run (e.g. `BMDB_URL`), restored after.
 */
export async function runReadmeExample(
  packageDir: string,
  options: { tag?: string; env?: Readonly<Record<string, string>> } = {},
): Promise<string[]> {
  const { tag } = options;
  const readme = await readFile(path.join(packageDir, 'README.md'), 'utf8');
  const fence = tag === undefined ? '```ts\n' : `\`\`\`ts ${tag}\n`;
  const start = readme.indexOf(fence);
  const code = start < 0 ? undefined : readme.slice(start + fence.length, readme.indexOf('```', start + fence.length));
  if (!code) throw new Error(`${packageDir}/README.md has no ${fence.trim()} example`);
  // A file of its own per example: modules are cached by path.
  const file = path.join(packageDir, `.readme-example-${process.pid}-${tag ?? 'first'}.ts`);
  await writeFile(file, code);
  const logged: string[] = [];
  const original = console.log;
  console.log = (...args: unknown[]) => {
    logged.push(args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a))).join(' '));
  };
  const tmp = await mkdtemp(path.join(tmpdir(), 'readme-tmp-'));
  // As root the embedded server runs as `postgres`, which must reach its data directory in here.
  await chmod(tmp, 0o755);
  // os.tmpdir() reads TMPDIR on every call.
  const env = { ...options.env, TMPDIR: tmp };
  const previous = Object.fromEntries(Object.keys(env).map((name) => [name, process.env[name]]));
  Object.assign(process.env, env);
  let left: string[];
  try {
    await import(file);
  } finally {
    console.log = original;
    for (const [name, value] of Object.entries(previous)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    await rm(file, { force: true });
    left = await readdir(tmp);
    await rm(tmp, { recursive: true, force: true });
  }
  if (left.length > 0) {
    throw new Error(
      `${path.join(packageDir, 'README.md')}: the example left ${left.join(', ')} in its temporary directory`,
    );
  }
  return logged;
}
