import { createPrivateKey, generateKeyPairSync, X509Certificate } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';
import { ServerTlsError } from './errors.js';
import { log } from './log.js';

/** The server's certificate and key, PEM. */
export interface ServerTls {
  readonly cert: string;
  readonly key: string;
  /** Where the certificate is, for operators to hand to `--agent-endpoint-ca-certificate-path`. */
  readonly certPath: string;
}

/** Reads a PEM certificate and key, checking that they belong together. */
export async function loadServerTls(certPath: string, keyPath: string): Promise<ServerTls> {
  const cert = await readText(certPath);
  const key = await readText(keyPath);
  let certificate: X509Certificate;
  try {
    certificate = new X509Certificate(cert);
  } catch (error) {
    throw new ServerTlsError(certPath, `not a PEM X.509 certificate (${(error as Error).message})`, { cause: error });
  }
  try {
    if (!certificate.checkPrivateKey(createPrivateKey(key))) {
      throw new ServerTlsError(keyPath, `not the private key of the certificate ${certPath}`);
    }
  } catch (error) {
    if (error instanceof ServerTlsError) throw error;
    throw new ServerTlsError(keyPath, `not a PEM private key (${(error as Error).message})`, { cause: error });
  }
  return { cert, key, certPath };
}

/** Where {@link selfSignedServerTls} keeps a certificate, and whom it is for. */
export interface SelfSignedTlsOptions {
  /** The files' name: `<name>.crt` and `<name>.key`. Default `server`. */
  readonly name?: string;
  /** DNS names and addresses it is for, made once: default this host's name, localhost and the loopback addresses. */
  readonly altNames?: readonly string[];
}

/**
 * The self-signed certificate under `dir` (`server.crt`, `server.key`, or
 * `<name>.*`), made on first use: an ECDSA P-256 key and a CA-flagged
 * certificate for its alternative names, so clients (agents, browsers) can
 * trust it as its own root. Later calls load it, whatever names they give.
 */
export async function selfSignedServerTls(
  dir: string,
  options: SelfSignedTlsOptions = {},
): Promise<ServerTls & { readonly created: boolean }> {
  const name = options.name ?? 'server';
  const altNames = options.altNames ?? LOCAL_NAMES();
  const certPath = path.join(dir, `${name}.crt`);
  const keyPath = path.join(dir, `${name}.key`);
  try {
    return { ...(await loadServerTls(certPath, keyPath)), created: false };
  } catch (error) {
    if (!(error instanceof ServerTlsError && (error.cause as NodeJS.ErrnoException)?.code === 'ENOENT')) throw error;
  }
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const cert = certificatePem(selfSignedCertificate(privateKey, { commonName: `bmaas-${name}`, altNames, ca: true }));
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  try {
    await mkdir(dir, { recursive: true });
    // The key first, so a certificate on disk always has its key beside it.
    await writeAtomically(keyPath, key, 0o600);
    await writeAtomically(certPath, cert, 0o644);
  } catch (error) {
    throw new ServerTlsError(dir, `cannot write the self-signed certificate (${(error as Error).message})`, {
      cause: error,
    });
  }
  log.server('generated a self-signed certificate at %s for %s', certPath, altNames.join(', '));
  return { cert, key, certPath, created: true };
}

/** This host's name, localhost and the loopback addresses. */
const LOCAL_NAMES = () => [hostname(), 'localhost', '127.0.0.1', '::1'];

async function readText(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw new ServerTlsError(file, `cannot read it (${code ?? (error as Error).message})`, { cause: error });
  }
}

async function writeAtomically(file: string, contents: string, mode: number): Promise<void> {
  const temporary = `${file}.${process.pid}.tmp`;
  await writeFile(temporary, contents, { mode });
  await rename(temporary, file);
}
