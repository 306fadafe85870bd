import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/** A self-signed certificate and its key, PEM. The certificate is its own CA. */
export interface TestCertificate {
  readonly key: string;
  readonly cert: string;
}

/**
 * Makes a throwaway self-signed P-256 certificate valid for `ipAddresses`
 * (default 127.0.0.1) and `localhost`, for one day, with the `openssl`
 * command (Debian's openssl package).
 */
export async function selfSignedCertificate(ipAddresses: readonly string[] = ['127.0.0.1']): Promise<TestCertificate> {
  const dir = await mkdtemp(path.join(tmpdir(), 'fake-redfish-cert-'));
  try {
    const key = path.join(dir, 'key.pem');
    const cert = path.join(dir, 'cert.pem');
    const names = ['DNS:localhost', ...ipAddresses.map((ip) => `IP:${ip}`)].join(',');
    try {
      await execFileAsync('openssl', [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-days',
        '1',
        '-subj',
        '/CN=fake-redfish',
        '-addext',
        `subjectAltName=${names}`,
        '-keyout',
        key,
        '-out',
        cert,
      ]);
    } catch (error) {
      throw new Error(`openssl could not make a test certificate: ${(error as Error).message}`, { cause: error });
    }
    return { key: await readFile(key, 'utf8'), cert: await readFile(cert, 'utf8') };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
