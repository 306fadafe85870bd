import { existsSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { CallGraph } from './support/call-graph.js';

/**
 * ARCHITECTURE.md is a map: it names files, and functions in them, as
 * backticked `path` or `path:Name.member`. A map that points at a moved file
 * or a renamed function misleads the reader it was written for, so every
 * reference is checked against the tree; and the claim and end paths are
 * steps `A` → `B`, each checked to be a call (or hand-over) of B in A by the
 * TypeScript compiler, so a path that no longer runs that way fails here.
 */

const root = fileURLToPath(new URL('..', import.meta.url));
const map = readFileSync(path.join(root, 'ARCHITECTURE.md'), 'utf8');

/**
 * A backticked repository path (a folder ends in `/`), or a file's short name
 * (`session.ts`, `internal/ends.ts`: under the core's src/, else the
 * model's, unless at the root), optionally with `:identifier`.
 */
const REFERENCE =
  /`((?:packages|proto|bench|test|scripts)\/[\w./<>-]*|[\w./-]+\.(?:ts|json|md|proto))(?::([#\w.]+))?`/g;
/** Where a short name is looked for, in this order: the core's sources, then the model's. */
const LIBRARY_SOURCES = ['packages/bmdb-controlloop/src', 'packages/bmdb-model/src'] as const;

interface Reference {
  readonly file: string;
  readonly names: readonly string[];
}

/** A step of a path: `from` calls or hands over `to`; numbered steps make the path, bullets are its other entries. */
interface Step {
  readonly line: string;
  readonly numbered: boolean;
  readonly from: Reference;
  readonly to: Reference;
}

/** The steps of the section under `heading`: its numbered and bulleted lines of the form `A` → `B`. */
function steps(heading: string): Step[] {
  const start = map.indexOf(heading);
  if (start < 0) return [];
  const section = map.slice(start, map.indexOf('\n## ', start + heading.length));
  return section.split('\n').flatMap((line) => {
    const arrow = /^(\d+\.|-) (`[^`]+`) → (`[^`]+`)/.exec(line);
    if (!arrow) return [];
    const [from, to] = [...references(arrow[2] ?? ''), ...references(arrow[3] ?? '')];
    return from && to ? [{ line, numbered: arrow[1] !== '-', from, to }] : [];
  });
}

/** `file:Name.member` as the call graph takes it. */
const nameOf = (reference: Reference) => reference.names.join('.');

function references(text: string): Reference[] {
  return [...text.matchAll(REFERENCE)].map(([, file = '', name]) => ({
    file:
      /^(packages|proto|bench|test|scripts)\//.test(file) || existsSync(path.join(root, file)) ? file : shortName(file),
    names: name === undefined ? [] : name.split('.').filter((part) => part !== ''),
  }));
}

/** A short name's file: the core's, else the model's (a name in neither stays the core's, and fails as missing). */
function shortName(file: string): string {
  const [core, model] = LIBRARY_SOURCES;
  return existsSync(path.join(root, core, file)) || !existsSync(path.join(root, model, file))
    ? `${core}/${file}`
    : `${model}/${file}`;
}

/** Whether `source` has `name` as a whole identifier (`#claim` is not `#claimSelected`). */
function hasIdentifier(source: string, name: string): boolean {
  const escaped = name.replace(/[$#]/g, (c) => `\\${c}`);
  return new RegExp(`(?<![\\w$#])${escaped}(?![\\w$])`).test(source);
}

describe('ARCHITECTURE.md', () => {
  const found = references(map).filter((r) => !r.file.includes('<'));

  it('names files and functions', () => {
    expect(found.length).toBeGreaterThan(50);
    expect(found.filter((r) => r.names.length > 0).length).toBeGreaterThan(30);
  });

  it('names only files and folders that exist', () => {
    const missing = found.filter((r) => !existsSync(path.join(root, r.file))).map((r) => r.file);
    expect(missing).toEqual([]);
    const notFolders = found
      .filter((r) => r.file.endsWith('/') && !statSync(path.join(root, r.file)).isDirectory())
      .map((r) => r.file);
    expect(notFolders).toEqual([]);
  });

  it('names only functions, classes and members its files contain', () => {
    const missing = found.flatMap((r) => {
      const full = path.join(root, r.file);
      if (r.names.length === 0 || !existsSync(full)) return [];
      const source = readFileSync(full, 'utf8');
      return r.names.filter((name) => !hasIdentifier(source, name)).map((name) => `${r.file}:${name}`);
    });
    expect(missing).toEqual([]);
  });

  it('gives the claim path and the end path as numbered steps, each read in at most five files', () => {
    for (const heading of ['## The claim path', '## The end path']) {
      const numbered = steps(heading).filter((step) => step.numbered);
      expect(numbered.length, heading).toBeGreaterThanOrEqual(5);
      // Each step after the first starts where an earlier one went: the path is one walk.
      const reached = new Set([`${numbered[0]?.from.file}:${nameOf(numbered[0]?.from ?? { file: '', names: [] })}`]);
      for (const step of numbered) {
        expect(reached, `${heading}: ${step.line}`).toContain(`${step.from.file}:${nameOf(step.from)}`);
        reached.add(`${step.to.file}:${nameOf(step.to)}`);
      }
      const files = new Set(numbered.flatMap((step) => [step.from.file, step.to.file]));
      expect(files.size, `${heading}: ${[...files].join(', ')}`).toBeLessThanOrEqual(5);
    }
  });

  it('gives the agent heartbeat path, from the stream listener to its statement, as numbered steps in at most six files', () => {
    const heading = '## The agent heartbeat path';
    const numbered = steps(heading).filter((step) => step.numbered);
    expect(numbered.length).toBeGreaterThanOrEqual(5);
    expect(numbered[0]?.from.file).toBe('packages/server/src/server.ts');
    expect(numbered.at(-1)?.to.file).toBe('packages/bmdb-model/src/sql/agent-heartbeat.ts');
    const reached = new Set([`${numbered[0]?.from.file}:${nameOf(numbered[0]?.from ?? { file: '', names: [] })}`]);
    for (const step of numbered) {
      expect(reached, `${heading}: ${step.line}`).toContain(`${step.from.file}:${nameOf(step.from)}`);
      reached.add(`${step.to.file}:${nameOf(step.to)}`);
    }
    const files = new Set(numbered.flatMap((step) => [step.from.file, step.to.file]));
    expect(files.size, [...files].join(', ')).toBeLessThanOrEqual(6);
  });

  describe('paths as the code runs them', () => {
    const pathSteps = [
      '## The claim path',
      '## The end path',
      '## The power-action path',
      '## The agent heartbeat path',
    ].flatMap(steps);
    // One program for every file a step names, with what they import.
    const graph = new CallGraph(
      root,
      [...new Set(pathSteps.flatMap((step) => [step.from.file, step.to.file]))].map((file) => path.join(root, file)),
    );
    const edge = (from: Reference, to: Reference) => {
      const [a, b] = [graph.declaration(from.file, nameOf(from)), graph.declaration(to.file, nameOf(to))];
      expect(a, `${from.file}:${nameOf(from)}`).toBeDefined();
      expect(b, `${to.file}:${nameOf(to)}`).toBeDefined();
      return a !== undefined && b !== undefined && graph.references(a, b);
    };

    it('each step of the claim, end, power-action and agent heartbeat paths is a call its first function makes', () => {
      expect(pathSteps.length).toBeGreaterThan(15);
      const stale = pathSteps.filter((step) => !edge(step.from, step.to)).map((step) => step.line);
      expect(stale).toEqual([]);
    }, 60_000);

    it('sees a step that does not hold', () => {
      const [claim, close, process, cancel, workCancel] = references(
        '`control-loop.ts:Runner.#claim` `session.ts:Session.close` `control-loop.ts:Runner.#process` `control-loop.ts:cancel` `work.ts:Work.cancel`',
      ) as [Reference, Reference, Reference, Reference, Reference];
      expect(edge(claim, close)).toBe(false);
      // #process cancels through cancel(), which calls Work.cancel: one step each, not one for both.
      expect(edge(process, cancel)).toBe(true);
      expect(edge(cancel, workCancel)).toBe(true);
      expect(edge(process, workCancel)).toBe(false);
    });
  });

  // A program over every index: seconds on a loaded machine.
  it('lists what each index exports', () => {
    const start = map.indexOf('## Public surface');
    expect(start).toBeGreaterThanOrEqual(0);
    const section = map.slice(start, map.indexOf('\n## ', start + 1));
    const listed = section.split('\n').flatMap((line) => {
      const row = /^\| `[^`]+` \(`([^`]+)`\) \| (\d+) \| (.*) \|$/.exec(line);
      return row
        ? [
            {
              file: row[1] ?? '',
              count: Number(row[2]),
              names: [...(row[3] ?? '').matchAll(/`([^`]+)`/g)].map((m) => m[1]),
            },
          ]
        : [];
    });
    expect(listed.length).toBeGreaterThan(8);
    const graph = new CallGraph(
      root,
      listed.map((entry) => path.join(root, entry.file)),
    );
    for (const entry of listed) {
      const exported = graph.exportsOf(entry.file).sort();
      expect(entry.names.sort(), entry.file).toEqual(exported);
      expect(entry.count, entry.file).toBe(exported.length);
    }
  }, 60_000);

  it('catches a reference to a missing file or function', () => {
    const [bad] = references('`packages/bmdb-controlloop/src/session.ts:noSuchFunction`');
    expect(bad).toEqual({ file: 'packages/bmdb-controlloop/src/session.ts', names: ['noSuchFunction'] });
    const source = readFileSync(path.join(root, 'packages/bmdb-controlloop/src/session.ts'), 'utf8');
    expect(hasIdentifier(source, 'noSuchFunction')).toBe(false);
    expect(hasIdentifier(source, '#claimSelected')).toBe(true);
    expect(hasIdentifier('#claimSelected()', '#claim')).toBe(false);
  });
});
