import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/**
 * The modules of the core (`@bmaas/bmdb-controlloop`) and of the machine
 * model (`@bmaas/bmdb-model`) in layers, lowest first (ARCHITECTURE.md,
 * *The library's layers*): a module imports only from its own layer or
 * those below, and no two modules import each other, directly or around a
 * circle. A reader then finds what a module rests on below it, never above.
 * Imports are read by the TypeScript compiler (type-only imports and
 * re-exports count: they tie modules together as much as any).
 */

interface Package {
  readonly name: string;
  readonly sources: string;
  /** Each layer and the files (relative to src/) in it. */
  readonly layers: readonly (readonly [string, RegExp])[];
}

const CORE: Package = {
  name: '@bmaas/bmdb-controlloop',
  sources: fileURLToPath(new URL('../packages/bmdb-controlloop/src/', import.meta.url)),
  layers: [
    [
      'base: the schema, errors, values, conditions and the metrics',
      /^(errors|schema|hardware-totals|tags|backoff|duration|redact-url|work-candidate|metrics|conditions)\.ts$/,
    ],
    ['sql/: the statements that claim, end and keep sessions', /^sql\//],
    ['selections', /^selection\.ts$/],
    ['internal/: the connection parts; embedded/, migrations/', /^(internal\/|embedded\/|embedded\.ts$|migrations\/)/],
    ['sessions and their work', /^(session|session-life|session-parts|work)\.ts$/],
    ['rounds, the live sessions', /^(rounds|live-sessions)\.ts$/],
    ['the connection', /^connection\.ts$/],
    ['the control-loop runner', /^(control-loop|limiter)\.ts$/],
    ['the entries', /^(index|extend)\.ts$/],
  ],
};

const MODEL: Package = {
  name: '@bmaas/bmdb-model',
  sources: fileURLToPath(new URL('../packages/bmdb-model/src/', import.meta.url)),
  layers: [
    [
      'base: the tables, errors and values',
      /^(schema|errors|root-device-hints|first-boot|hardware-report|agent-heartbeat-check)\.ts$/,
    ],
    ['sql/: the agent heartbeat statement', /^sql\//],
    ['queries/: reads, tag writes, selections', /^queries\//],
    ["internal/: the fleet reader's connection", /^internal\//],
    ['agent heartbeats, the fleet gauges', /^(agent-heartbeats|fleet-gauges|fleet-metrics)\.ts$/],
    ['the index', /^index\.ts$/],
  ],
};

/** The layer of `file` (relative to src/), or -1. */
function layerOf(pkg: Package, file: string): number {
  return pkg.layers.findIndex(([, files]) => files.test(file));
}

/** Every TypeScript file under src/, relative to src/. */
function sourceFiles(pkg: Package): string[] {
  return readdirSync(pkg.sources, { recursive: true, encoding: 'utf8' })
    .map((file) => file.split(path.sep).join('/'))
    .filter((file) => file.endsWith('.ts'))
    .sort();
}

/** What `file` imports or re-exports from, as the compiler reads them. */
function specifiersOf(pkg: Package, file: string): string[] {
  const { importedFiles } = ts.preProcessFile(readFileSync(path.join(pkg.sources, file), 'utf8'), true, true);
  return importedFiles.map((imported) => imported.fileName);
}

/** The files of its own package `file` imports or re-exports from. */
function importsOf(pkg: Package, file: string): string[] {
  return specifiersOf(pkg, file)
    .filter((name) => name.startsWith('.'))
    .map((name) => path.posix.normalize(path.posix.join(path.posix.dirname(file), name)).replace(/\.js$/, '.ts'));
}

/** The workspace packages (`@bmaas/...`, with their subpath) `pkg`'s sources import. */
function workspaceImports(pkg: Package): string[] {
  return [
    ...new Set(sourceFiles(pkg).flatMap((file) => specifiersOf(pkg, file).filter((s) => s.startsWith('@bmaas/')))),
  ].sort();
}

type Graph = ReadonlyMap<string, readonly string[]>;

/** Imports from a lower layer to a higher one, as `a → b`. */
function upwardImports(pkg: Package, graph: Graph): string[] {
  return [...graph].flatMap(([file, imports]) =>
    imports
      .filter((imported) => layerOf(pkg, imported) > layerOf(pkg, file))
      .map((imported) => `${file} → ${imported}`),
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

for (const pkg of [CORE, MODEL]) {
  describe(`${pkg.name}'s layers`, () => {
    const files = sourceFiles(pkg);
    const graph: Graph = new Map(files.map((file) => [file, importsOf(pkg, file)]));

    it('reads the imports of every module', () => {
      expect(files.length).toBeGreaterThan(20);
      const [importer, imported] =
        pkg === CORE ? ['session.ts', 'work.ts'] : ['agent-heartbeats.ts', 'sql/agent-heartbeat.ts'];
      expect(graph.get(importer)).toContain(imported);
    });

    it('puts every module in a layer', () => {
      expect(files.filter((file) => layerOf(pkg, file) < 0)).toEqual([]);
    });

    it('has no import from a lower layer to a higher one', () => {
      expect(upwardImports(pkg, graph)).toEqual([]);
    });

    it('has no import cycle', () => {
      expect(cycles(graph)).toEqual([]);
    });
  });
}

describe('the core and the model apart', () => {
  it('the core imports no workspace package but common: never the model', () => {
    expect(workspaceImports(CORE)).toEqual(['@bmaas/common']);
  });

  it('the model imports the core (its main entry and /extend), common and the generated API, nothing else of the workspace', () => {
    const packages = workspaceImports(MODEL).map((specifier) =>
      specifier.startsWith('@bmaas/api/') ? '@bmaas/api' : specifier,
    );
    expect([...new Set(packages)]).toEqual([
      '@bmaas/api',
      '@bmaas/bmdb-controlloop',
      '@bmaas/bmdb-controlloop/extend',
      '@bmaas/common',
    ]);
  });

  it("no other package's code uses the core's extension entry", () => {
    const root = fileURLToPath(new URL('..', import.meta.url));
    const users = readdirSync(path.join(root, 'packages'))
      .filter((dir) => dir !== 'bmdb-model' && dir !== 'bmdb-controlloop')
      .flatMap((dir) => {
        const pkg: Package = { name: dir, sources: path.join(root, 'packages', dir, 'src'), layers: [] };
        return workspaceImports(pkg).includes('@bmaas/bmdb-controlloop/extend') ? [dir] : [];
      });
    expect(users).toEqual([]);
  });

  it('sees a model import in the core', () => {
    const tangled: Package = { ...CORE, sources: MODEL.sources };
    expect(workspaceImports(tangled)).toContain('@bmaas/bmdb-controlloop');
  });
});

describe('the layer checks', () => {
  it('see an upward import and a cycle', () => {
    const tangled: Graph = new Map([
      ['sql/claim.ts', ['selection.ts']],
      ['session.ts', ['work.ts']],
      ['work.ts', ['session.ts']],
    ]);
    expect(upwardImports(CORE, tangled)).toEqual(['sql/claim.ts → selection.ts']);
    expect(cycles(tangled)).toEqual(['session.ts → work.ts → session.ts']);
  });
});
