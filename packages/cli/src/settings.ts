import { X509Certificate } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { hostname, userInfo } from 'node:os';
import path from 'node:path';
import { InvalidSettingError, parseDuration, parseLimiter, type RateLimiter, redactUrl } from '@bmaas/bmdb-controlloop';

/**
 * Bad input on the command line or in the environment. The CLI prints its
 * one-line message and exits with status 2, before anything is touched.
 */
export class UsageError extends Error {
  override name = 'UsageError';
  constructor(
    readonly flag: string,
    problem: string,
  ) {
    super(`--${flag}: ${problem}`);
  }

  /** `--flag: invalid value "v": want <expected>`. */
  static invalid(flag: string, value: string, expected: string): UsageError {
    return new UsageError(flag, `invalid value ${JSON.stringify(value)}: want ${expected}`);
  }
}

/** Parsed command-line arguments, keyed by flag name. */
export type Argv = Readonly<Record<string, unknown>>;

/** A flag's value, `undefined` when unset or empty. */
export function optional(argv: Argv, flag: string): string | undefined {
  const value = argv[flag];
  if (value === undefined || value === '') return undefined;
  return String(value);
}

export function required(argv: Argv, flag: string, context: string): string {
  const value = optional(argv, flag);
  if (value === undefined) {
    throw new UsageError(flag, `required for ${context} (or set ${envName(flag)})`);
  }
  return value;
}

/** Milliseconds, from Go duration syntax; must be > 0 unless `allowZero`. */
export function duration(argv: Argv, flag: string, options: { allowZero?: boolean } = {}): number {
  const value = required(argv, flag, 'this command');
  let ms: number;
  try {
    ms = parseDuration(value);
  } catch {
    throw UsageError.invalid(flag, value, "a duration such as '500ms', '30s', '10m' or '1h30m'");
  }
  if (ms < 0 || (ms === 0 && !options.allowZero)) {
    throw UsageError.invalid(flag, value, 'a duration greater than zero');
  }
  return ms;
}

/** Timers wait at most 2^31-1 ms (about 596 hours). */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/** A duration a timer waits: greater than zero, at most 596h, in whole milliseconds (rounded up). */
export function timerDuration(argv: Argv, flag: string): number {
  const ms = Math.ceil(duration(argv, flag));
  if (ms > LONGEST_TIMER_MS) throw UsageError.invalid(flag, String(argv[flag]), 'a duration of at most 596h');
  return ms;
}

export function rate(argv: Argv, flag: string): RateLimiter {
  const value = required(argv, flag, 'this command');
  try {
    return parseLimiter(value);
  } catch (error) {
    if (error instanceof InvalidSettingError) throw new UsageError(flag, error.message);
    throw error;
  }
}

export function integer(argv: Argv, flag: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const value = required(argv, flag, 'this command');
  if (!/^\d+$/.test(value.trim()) || Number(value) < min || Number(value) > max) {
    throw UsageError.invalid(flag, value, `a whole number from ${min} to ${max}`);
  }
  return Number(value);
}

const BYTE_UNITS: Record<string, number> = { '': 1, B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3 };

/** A number of bytes, whole or with a binary unit (`65536`, `64KiB`, `16MiB`, `1GiB`), at least `min`. */
export function byteSize(argv: Argv, flag: string, min: number): number {
  const value = required(argv, flag, 'this command');
  const match = /^(\d+)\s*(B|KiB|MiB|GiB)?$/.exec(value.trim());
  const bytes = match ? Number(match[1]) * (BYTE_UNITS[match[2] ?? ''] ?? 1) : Number.NaN;
  if (!Number.isSafeInteger(bytes) || bytes < min) {
    throw UsageError.invalid(flag, value, `a size of at least ${min} bytes, such as 65536, 64KiB, 16MiB or 1GiB`);
  }
  return bytes;
}

/** A share from 0 to 1. */
export function share(argv: Argv, flag: string): number {
  const value = required(argv, flag, 'this command');
  const number = Number(value);
  if (value.trim() === '' || !(number >= 0 && number <= 1)) {
    throw UsageError.invalid(flag, value, 'a share between 0 and 1, e.g. 0.1');
  }
  return number;
}

/** `host:port` (`[::1]:9090` for IPv6). */
export function hostPort(argv: Argv, flag: string): { host: string; port: number } | undefined {
  const value = optional(argv, flag);
  if (value === undefined) return undefined;
  const match = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(value);
  const port = Number(match?.[3]);
  if (!match || port < 1 || port > 65535) {
    throw UsageError.invalid(flag, value, 'host:port, e.g. 127.0.0.1:9090 or [::1]:9090');
  }
  return { host: match[1] ?? (match[2] || '0.0.0.0'), port };
}

/** A value copied from a template that still says FIXME is refused. */
export function noPlaceholder(flag: string, value: string): string {
  if (/fixme/i.test(value)) throw UsageError.invalid(flag, value, 'a real value, not the FIXME placeholder');
  return value;
}

/** The contents of a non-empty file. */
export async function fileContents(flag: string, file: string): Promise<Buffer> {
  let data: Buffer;
  try {
    data = await readFile(file);
  } catch (error) {
    const reason = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
    throw new UsageError(flag, `cannot read ${JSON.stringify(file)} (${reason})`);
  }
  if (data.length === 0) throw new UsageError(flag, `${JSON.stringify(file)} is empty`);
  return data;
}

/** A PEM X.509 certificate file, as DER (what `TakeoverInit.ca_certificate` carries). */
export async function pemCertificate(flag: string, file: string): Promise<Uint8Array> {
  const pem = await fileContents(flag, file);
  try {
    return new Uint8Array(new X509Certificate(pem).raw);
  } catch (error) {
    throw new UsageError(flag, `${JSON.stringify(file)} is not a PEM X.509 certificate (${(error as Error).message})`);
  }
}

export function envName(flag: string): string {
  return `SHEPHERD_${flag.replaceAll('-', '_').toUpperCase()}`;
}

/** Where the BMDB is: a URL, or an embedded server's data directory. */
export interface DatabaseSettings {
  readonly url: string | undefined;
  readonly dataDir: string;
  readonly componentName: string;
  /** Milliseconds, whole seconds. */
  readonly sessionInterval: number;
}

export function databaseSettings(argv: Argv): DatabaseSettings {
  const url = optional(argv, 'bmdb-url');
  if (url !== undefined) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw UsageError.invalid('bmdb-url', redactUrl(url), 'a URL such as postgres://user:password@host:5432/bmdb');
    }
    if (parsed.protocol !== 'postgres:' && parsed.protocol !== 'postgresql:') {
      throw UsageError.invalid('bmdb-url', redactUrl(url), 'a postgres:// or postgresql:// URL');
    }
  }
  const sessionInterval = duration(argv, 'bmdb-session-interval');
  if (sessionInterval % 1000 !== 0) {
    throw UsageError.invalid(
      'bmdb-session-interval',
      String(argv['bmdb-session-interval']),
      'whole seconds, e.g. 5s or 1m',
    );
  }
  return {
    url,
    dataDir: path.resolve(required(argv, 'data-dir', 'the embedded BMDB')),
    componentName: required(argv, 'component-name', 'BMDB sessions'),
    sessionInterval,
  };
}

/** The key path: `--ssh-key-path`, or `ssh_key` in the data directory. */
export function sshKeyPath(argv: Argv): string {
  return path.resolve(
    optional(argv, 'ssh-key-path') ?? path.join(required(argv, 'data-dir', 'the SSH key'), 'ssh_key'),
  );
}

/** The flag the key path comes from, for messages about its directory. */
export function sshKeyFlag(argv: Argv): 'ssh-key-path' | 'data-dir' {
  return optional(argv, 'ssh-key-path') === undefined ? 'data-dir' : 'ssh-key-path';
}

/** The test agent shipped with @bmaas/shepherd-manager, the dummy provider's default agent. */
export function bundledTestAgent(): string {
  return createRequire(import.meta.url).resolve('@bmaas/shepherd-manager/test-agent');
}

/** One of `values`. */
export function oneOf<T extends string>(argv: Argv, flag: string, values: readonly T[]): T | undefined {
  const value = optional(argv, flag);
  if (value === undefined) return undefined;
  if (!(values as readonly string[]).includes(value))
    throw UsageError.invalid(flag, value, `one of ${values.join(', ')}`);
  return value as T;
}

/** A PEM file of one or more X.509 certificates, as its text. */
export async function pemCertificates(flag: string, file: string): Promise<string> {
  const pem = (await fileContents(flag, file)).toString('utf8');
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  if (blocks.length === 0) throw new UsageError(flag, `${JSON.stringify(file)} holds no PEM certificate`);
  for (const block of blocks) {
    try {
      new X509Certificate(block);
    } catch (error) {
      throw new UsageError(flag, `${JSON.stringify(file)} holds a bad PEM certificate (${(error as Error).message})`);
    }
  }
  return pem;
}

/**
 * A file holding a secret: readable, not empty, and not readable by group or
 * others (as OpenSSH wants of keys). Its contents are never shown.
 */
export async function secretFile(flag: string, file: string): Promise<string> {
  const resolved = path.resolve(file);
  await fileContents(flag, resolved);
  const mode = (await stat(resolved)).mode & 0o777;
  if ((mode & 0o077) !== 0) {
    throw new UsageError(
      flag,
      `${JSON.stringify(file)} is readable by group or others (mode ${mode.toString(8).padStart(4, '0')}); chmod 600 it`,
    );
  }
  return resolved;
}

/** Where a process serves its metrics, and how often the fleet gauges are read if it is their reader. */
export interface MetricsSettings {
  readonly listen: { host: string; port: number };
  /** Milliseconds. */
  readonly fleetInterval: number;
}

/**
 * `--metrics-listen` and `--fleet-metrics-interval`; `undefined` when no
 * metrics are served. The interval is checked either way.
 */
export function metricsSettings(argv: Argv): MetricsSettings | undefined {
  const fleetInterval = duration(argv, 'fleet-metrics-interval');
  if (fleetInterval < 1000) {
    throw UsageError.invalid('fleet-metrics-interval', String(argv['fleet-metrics-interval']), 'at least 1s');
  }
  const listen = hostPort(argv, 'metrics-listen');
  return listen && { listen, fleetInterval };
}

/** Who acts: `--actor`, else `<user>@<host>` of this process. */
export function actor(argv: Argv): string {
  const given = optional(argv, 'actor')?.trim();
  if (given !== undefined && given !== '') return given;
  let user: string;
  try {
    user = userInfo().username;
  } catch {
    // A uid without a passwd entry (a container): the environment may still say.
    user = process.env.USER ?? `uid-${process.getuid?.() ?? 'unknown'}`;
  }
  return `${user}@${hostname()}`;
}

/** `--reason`, required (`for` what), not blank. */
export function reason(argv: Argv, context: string): string {
  const value = optional(argv, 'reason')?.trim();
  if (value === undefined || value === '') {
    throw new UsageError('reason', `required for ${context}: say why (it is recorded in the machine's history)`);
  }
  return value;
}
