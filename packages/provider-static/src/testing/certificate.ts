import { generateKeyPairSync } from 'node:crypto';
import { certificatePem, selfSignedCertificate as selfSignedDer } from '@bmaas/common';

/** A self-signed certificate and its key, PEM. The certificate is its own CA. */
export interface TestCertificate {
  readonly key: string;
  readonly cert: string;
}

/**
 * Makes a throwaway self-signed P-256 certificate valid for `ipAddresses`
 * (default 127.0.0.1) and `localhost`, for one day: `@bmaas/common`'s
 * X.509 writer, so no `openssl` command is needed.
 */
export async function selfSignedCertificate(ipAddresses: readonly string[] = ['127.0.0.1']): Promise<TestCertificate> {
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const notBefore = new Date(Date.now() - 3_600_000);
  const der = selfSignedDer(privateKey, {
    commonName: 'fake-redfish',
    altNames: ['localhost', ...ipAddresses],
    ca: true,
    notBefore,
    notAfter: new Date(notBefore.getTime() + 25 * 3_600_000),
  });
  return { key: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(), cert: certificatePem(der) };
}
