import { hostname } from 'node:os';
import path from 'node:path';
import { checkTlsRule, checkTokenRule, isLoopback, WebTlsError, WebTokenError } from '@bmaas/web';
import { type Argv, envName, hostPort, optional, required, UsageError } from './settings.js';
import { type TlsSource, tlsFiles } from './tls.js';

/** Where the fleet page listens, the token it asks for (never shown), and how it is kept off the wire. */
export interface WebSettings {
  readonly listen: { host: string; port: number };
  readonly token: string | undefined;
  /** Its certificate: files given, or a self-signed one under the data directory; undefined for plain HTTP. */
  readonly tls: TlsSource | undefined;
  /** `--web-insecure-http`: plain HTTP beyond loopback, a TLS proxy in front terminating it. */
  readonly insecureHttp: boolean;
}

const TLS_FLAGS = { cert: 'web-tls-cert', key: 'web-tls-key' } as const;

/**
 * `--web-listen`, `--web-token` and how the page is served: over TLS with
 * `--web-tls-cert`/`--web-tls-key` or `--web-tls-self-signed`, or as plain
 * HTTP on loopback or behind a TLS proxy (`--web-insecure-http`).
 * `undefined` when the page is off (no `--web-listen` and no `fallback`).
 * Beyond loopback, no token or no TLS is refused naming the flags, before
 * anything is touched.
 */
export function webSettings(argv: Argv, fallback?: { host: string; port: number }): WebSettings | undefined {
  const listen = hostPort(argv, 'web-listen') ?? fallback;
  if (listen === undefined) return undefined;
  const token = optional(argv, 'web-token');
  try {
    checkTokenRule(listen.host, token);
  } catch (error) {
    if (!(error instanceof WebTokenError)) throw error;
    throw new UsageError(
      'web-token',
      token === undefined
        ? `required to serve the fleet page on ${listen.host}:${listen.port}, beyond loopback (or set ${envName('web-token')}, or listen on 127.0.0.1)`
        : error.message,
    );
  }
  const files = tlsFiles(argv, TLS_FLAGS, 'for --web-tls-self-signed or plain HTTP');
  const selfSigned = argv['web-tls-self-signed'] === true;
  const insecureHttp = argv['web-insecure-http'] === true;
  if (files && selfSigned) {
    throw new UsageError(
      'web-tls-self-signed',
      'not with --web-tls-cert and --web-tls-key: one certificate or the other',
    );
  }
  const tls: TlsSource | undefined =
    files ??
    (selfSigned
      ? {
          selfSignedDir: path.resolve(required(argv, 'data-dir', 'a self-signed certificate')),
          name: 'web',
          altNames: certificateNames(listen.host),
        }
      : undefined);
  try {
    checkTlsRule(listen.host, { tls: tls !== undefined, insecureHttp });
  } catch (error) {
    if (!(error instanceof WebTlsError)) throw error;
    if (insecureHttp) {
      throw new UsageError(
        'web-insecure-http',
        'not with a certificate (--web-tls-cert, --web-tls-self-signed): the page is served either with TLS or as plain HTTP behind a TLS proxy',
      );
    }
    throw new UsageError(
      'web-tls-cert',
      `serving the fleet page on ${listen.host}:${listen.port}, beyond loopback, needs TLS: give --web-tls-cert and --web-tls-key, or --web-tls-self-signed for a certificate made once under --data-dir, or --web-insecure-http if a TLS proxy in front terminates TLS (or listen on 127.0.0.1)`,
    );
  }
  return { listen, token, tls, insecureHttp };
}

/** What a self-signed certificate of the page is for: this host, loopback, and the address listened on unless it is a wildcard. */
function certificateNames(host: string): string[] {
  const names = [hostname(), 'localhost', '127.0.0.1', '::1'];
  const bare = host.replace(/^\[|\]$/g, '');
  if (bare !== '0.0.0.0' && bare !== '::' && bare !== '' && !isLoopback(bare) && !names.includes(bare)) {
    names.push(bare);
  }
  return names;
}
