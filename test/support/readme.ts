import { readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * Runs the first ```ts block of a package README as a module, from inside
 * the package (so its imports resolve as a user's would), and returns what it
 * logged. Keeps the README's opening example honest.
 */
export async function runReadmeExample(packageDir: string): Promise<string[]> {
  const readme = await readFile(path.join(packageDir, 'README.md'), 'utf8');
  const code = /```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  if (!code) throw new Error(`${packageDir}/README.md has no \`\`\`ts example`);
  const file = path.join(packageDir, `.readme-example-${process.pid}.ts`);
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
