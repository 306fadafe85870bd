import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, test } from 'vitest';
import { buf, generatedAndCommitted } from '../../../test/support/proto.js';

const manifest = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
  exports: Record<string, { source: string; types: string; default: string }>;
};

describe("the API's generated code", () => {
  test('matches what buf generates from proto/ now (run `npm run generate -w proto` if not)', async () => {
    const { fresh, committed } = await generatedAndCommitted('buf.gen.yaml', 'packages/api/src/gen');
    expect(fresh.size).toBeGreaterThan(0);
    expect([...committed.keys()].sort()).toEqual([...fresh.keys()].sort());
    for (const [file, contents] of fresh) expect(committed.get(file), file).toBe(contents);
  });

  test('the .proto files pass buf lint', async () => {
    await buf(['lint']);
  });

  test('exports every generated module under its path, from source, declarations and JavaScript, and the hand-written network model and root-device hints', () => {
    const modules = readdirSync(new URL('../src/gen/', import.meta.url), { recursive: true, encoding: 'utf8' })
      .filter((file) => file.endsWith('.ts'))
      .map((file) => file.replace(/\.ts$/, ''))
      .sort();
    expect(modules.length).toBeGreaterThan(0);
    expect(Object.keys(manifest.exports).sort()).toEqual(
      [...modules.map((module) => `./${module}`), './network', './root-device-hints'].sort(),
    );
    expect(manifest.exports['./network']).toEqual({
      source: './src/network.ts',
      types: './dist/network.d.ts',
      default: './dist/network.js',
    });
    for (const module of modules) {
      expect(manifest.exports[`./${module}`], module).toEqual({
        source: `./src/gen/${module}.ts`,
        types: `./dist/gen/${module}.d.ts`,
        default: `./dist/gen/${module}.js`,
      });
    }
  });
});
