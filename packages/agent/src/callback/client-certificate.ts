import type { KeyObject } from 'node:crypto';
import { certificatePem, selfSignedCertificate } from '@bmaas/common';

/**
 * The agent's TLS client certificate: self-signed over its ed25519 key. The
 * server authenticates the agent by the key alone (the one its
 * TakeoverSuccess returned), so the certificate carries nothing else: a
 * common name, a validity, the key, the signature.
 */
export function clientCertificate(privateKey: KeyObject, machineId: string): string {
  if (privateKey.asymmetricKeyType !== 'ed25519') {
    throw new TypeError(`agent of machine ${machineId}: its key is ${privateKey.asymmetricKeyType}, not ed25519`);
  }
  // An hour back, as clocks disagree; a year on, as an agent lives for hours.
  const now = Date.now();
  const der = selfSignedCertificate(privateKey, {
    commonName: `agent ${machineId}`,
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + 365 * 86_400_000),
  });
  return certificatePem(der);
}
