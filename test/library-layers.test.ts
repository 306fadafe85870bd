import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/**
 * The library's modules in layers, lowest first (ARCHITECTURE.md, *The
 * library's layers*): a module imports only from its own layer or those
 * below, and no two modules import each other, directly or around a circle.
 * A reader then finds what a module rests on below it, never above. Imports
 * are read by the TypeScript compiler (type-only imports and re-exports
 * count: they tie modules together as much as any).
 */

const SOURCES = fileURLToPath(new URL('../packages/bmdb-controlloop/src/', import.meta.url));

/** Each layer and the library files (relative to src/) in it. */
const LAYERS: readonly (readonly [string, RegExp])[] = [
  [
    'base: the schema, errors, values and the metrics',
    /^(errors|schema|root-device-hints|first-boot|hardware-report|hardware-totals|tags|backoff|duration|redact-url|work-candidate|metrics|agent-heartbeat-check)\.ts$/,
  ],
  ['sql/: the statements that claim, end and keep sessions', /^sql\//],
  ['queries/: reads, tag writes, selections', /^(queries\/|queries\.ts$|selection\.ts$)/],
  ['internal/: the connection parts; embedded/, migrations/', /^(internal\/|embedded\/|embedded\.ts$|migrations\/)/],
  ['sessions and their work', /^(session|session-life|session-parts|work)\.ts$/],
  ['rounds, the fleet gauges, the live sessions', /^(rounds|fleet-gauges|fleet-metrics|live-sessions)\.ts$/],
  ['the connection', /^connection\.ts$/],
  ['the control-loop runner', /^(control-loop|limiter)\.ts$/],
  ['the index', /^index\.ts$/],
];

/** The layer of `file` (relative to src/), or -1. */
function layerOf(file: string): number {
  return LAYERS.findIndex(([, files]) => files.test(file));
}

/** Every TypeScript file under src/, relative to src/. */
function libraryFiles(): string[] {
  return readdirSync(SOURCES, { recursive: true, encoding: 'utf8' })
    .map((file) => file.split(path.sep).join('/'))
    .filter((file) => file.endsWith('.ts'))
    .sort();
}

/** The library files `file` imports or re-exports from, as the compiler reads them. */
function importsOf(file: string): string[] {
  const { importedFiles } = ts.preProcessFile(readFileSync(path.join(SOURCES, file), 'utf8'), true, true);
  return importedFiles
    .map((imported) => imported.fileName)
    .filter((name) => name.startsWith('.'))
    .map((name) => path.posix.normalize(path.posix.join(path.posix.dirname(file), name)).replace(/\.js$/, '.ts'));
}

type Graph = ReadonlyMap<string, readonly string[]>;

/** Imports from a lower layer to a higher one, as `a → b`. */
function upwardImports(graph: Graph): string[] {
  return [...graph].flatMap(([file, imports]) =>
    imports.filter((imported) => layerOf(imported) > layerOf(file)).map((imported) => `${file} → ${imported}`),
  );
}

/** Each circle of imports once, as `a → b → a`. */
function cycles(graph: Graph): string[] {
  const found: string[] = [];
  const done = new Set<string>();
  const visit = (file: string, trail: readonly string[]) => {
    const at = trail.indexOf(file);
    if (at >= 0) {
      found.push([...trail.slice(at), file].join(' → '));
      return;
    }
    if (done.has(file)) return;
    for (const imported of graph.get(file) ?? []) visit(imported, [...trail, file]);
    done.add(file);
  };
  for (const file of graph.keys()) visit(file, []);
  return found;
}

describe("the library's layers", () => {
  const files = libraryFiles();
  const graph: Graph = new Map(files.map((file) => [file, importsOf(file)]));

  it('reads the imports of every module', () => {
    expect(files.length).toBeGreaterThan(50);
    expect(graph.get('session.ts')).toContain('work.ts');
    expect(graph.get('work.ts')).toContain('session-life.ts');
  });

  it('puts every module in a layer', () => {
    expect(files.filter((file) => layerOf(file) < 0)).toEqual([]);
  });

  it('has no import from a lower layer to a higher one', () => {
    expect(upwardImports(graph)).toEqual([]);
  });

  it('has no import cycle', () => {
    expect(cycles(graph)).toEqual([]);
  });

  it('sees an upward import and a cycle', () => {
    const tangled: Graph = new Map([
      ['sql/claim.ts', ['selection.ts']],
      ['session.ts', ['work.ts']],
      ['work.ts', ['session.ts']],
    ]);
    expect(upwardImports(tangled)).toEqual(['sql/claim.ts → selection.ts']);
    expect(cycles(tangled)).toEqual(['session.ts → work.ts → session.ts']);
  });
});
