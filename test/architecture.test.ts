import { existsSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * ARCHITECTURE.md is a map: it names files, and functions in them, as
 * backticked `path` or `path:Name.member`. A map that points at a moved file
 * or a renamed function misleads the reader it was written for, so every
 * reference is checked against the tree.
 */

const root = fileURLToPath(new URL('..', import.meta.url));
const map = readFileSync(path.join(root, 'ARCHITECTURE.md'), 'utf8');

/**
 * A backticked repository path (a folder ends in `/`), or a file's short name
 * (`session.ts`, `internal/ends.ts`: under the library's src/ unless at the
 * root), optionally with `:identifier`.
 */
const REFERENCE =
  /`((?:packages|proto|bench|test|scripts)\/[\w./<>-]*|[\w./-]+\.(?:ts|json|md|proto))(?::([#\w.]+))?`/g;
const LIBRARY_SOURCES = 'packages/bmdb-controlloop/src';

interface Reference {
  readonly file: string;
  readonly names: readonly string[];
}

function references(text: string): Reference[] {
  return [...text.matchAll(REFERENCE)].map(([, file = '', name]) => ({
    file:
      /^(packages|proto|bench|test|scripts)\//.test(file) || existsSync(path.join(root, file))
        ? file
        : `${LIBRARY_SOURCES}/${file}`,
    names: name === undefined ? [] : name.split('.').filter((part) => part !== ''),
  }));
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

  it('gives the claim path and the end path as numbered file:function lists', () => {
    for (const heading of ['## The claim path', '## The end path']) {
      const start = map.indexOf(heading);
      expect(start, heading).toBeGreaterThanOrEqual(0);
      const section = map.slice(start, map.indexOf('\n## ', start + heading.length));
      const steps = section.split('\n').filter((line) => /^\d+\. /.test(line));
      expect(steps.length, heading).toBeGreaterThanOrEqual(5);
      expect(
        steps.every((step) => references(step).some((r) => r.names.length > 0)),
        `${heading}: every step names a file:function`,
      ).toBe(true);
    }
  });

  it('catches a reference to a missing file or function', () => {
    const [bad] = references('`packages/bmdb-controlloop/src/session.ts:noSuchFunction`');
    expect(bad).toEqual({ file: 'packages/bmdb-controlloop/src/session.ts', names: ['noSuchFunction'] });
    const source = readFileSync(path.join(root, 'packages/bmdb-controlloop/src/session.ts'), 'utf8');
    expect(hasIdentifier(source, 'noSuchFunction')).toBe(false);
    expect(hasIdentifier(source, '#claimSelected')).toBe(true);
    expect(hasIdentifier('#claimSelected()', '#claim')).toBe(false);
  });
});
