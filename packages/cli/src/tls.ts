import path from 'node:path';
import { loadServerTls, type ServerTls, ServerTlsError, selfSignedServerTls } from '@bmaas/server';
import { type Argv, optional, UsageError } from './settings.js';

/** The two flags naming a certificate and its key (`--tls-cert`, `--web-tls-cert`, …). */
export interface TlsFlags {
  readonly cert: string;
  readonly key: string;
}

/**
 * Where a TLS certificate comes from: files given on the command line, or a
 * self-signed one made once under the data directory (`<name>.crt`).
 */
export type TlsSource =
  | { readonly certPath: string; readonly keyPath: string; readonly flags: TlsFlags }
  | { readonly selfSignedDir: string; readonly name: string; readonly altNames?: readonly string[] };

/**
 * The certificate and key files of `flags`: both, or neither (undefined).
 * One without the other is bad input naming the missing flag; `orElse` says
 * what leaving both out does.
 */
export function tlsFiles(argv: Argv, flags: TlsFlags, orElse: string): TlsSource | undefined {
  const certPath = optional(argv, flags.cert);
  const keyPath = optional(argv, flags.key);
  if (certPath === undefined && keyPath === undefined) return undefined;
  if (certPath === undefined || keyPath === undefined) {
    const [given, missing] = certPath === undefined ? [flags.key, flags.cert] : [flags.cert, flags.key];
    throw new UsageError(missing, `required with --${given} (or leave both unset ${orElse})`);
  }
  return { certPath: path.resolve(certPath), keyPath: path.resolve(keyPath), flags };
}

/**
 * Loads (or makes, once) the certificate and key of `source`. A file that
 * cannot be read, is no certificate or is not the certificate's key is bad
 * input naming its flag; a self-signed one that cannot be written names
 * `--data-dir`.
 */
export async function loadTls(source: TlsSource): Promise<ServerTls & { readonly created: boolean }> {
  try {
    if ('selfSignedDir' in source) {
      return await selfSignedServerTls(source.selfSignedDir, {
        name: source.name,
        ...(source.altNames && { altNames: source.altNames }),
      });
    }
    return { ...(await loadServerTls(source.certPath, source.keyPath)), created: false };
  } catch (error) {
    if (!(error instanceof ServerTlsError)) throw error;
    if ('selfSignedDir' in source) throw new UsageError('data-dir', error.message);
    throw new UsageError(error.file === source.keyPath ? source.flags.key : source.flags.cert, error.message);
  }
}
