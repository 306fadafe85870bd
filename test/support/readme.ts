import { readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * Runs the first ```ts block of a package README (or the first whose fence
 * reads ```ts <tag>, e.g. `runnable`) as a module, from inside the package
 * (so its imports resolve as a user's would), and returns what it logged.
 * Keeps the README's examples honest.
 */
export async function runReadmeExample(packageDir: string, tag?: string): Promise<string[]> {
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
  try {
    await import(file);
  } finally {
    console.log = original;
    await rm(file, { force: true });
  }
  return logged;
}
