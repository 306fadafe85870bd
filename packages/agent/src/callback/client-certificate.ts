import { createPublicKey, type KeyObject, randomBytes, sign } from 'node:crypto';

/**
 * The agent's TLS client certificate: self-signed over its ed25519 key, DER
 * (RFC 5280, RFC 8410) by hand, as Node can read certificates but not make
 * them. The server authenticates the agent by the key alone (the one its
 * TakeoverSuccess returned), so the certificate carries nothing else: a
 * common name, a validity, the key, the signature.
 */
export function clientCertificate(privateKey: KeyObject, machineId: string): string {
  if (privateKey.asymmetricKeyType !== 'ed25519') {
    throw new TypeError(`agent of machine ${machineId}: its key is ${privateKey.asymmetricKeyType}, not ed25519`);
  }
  const ed25519 = tlv(0x30, tlv(0x06, Buffer.from([0x2b, 0x65, 0x70]))); // 1.3.101.112
  const name = tlv(
    0x30,
    tlv(0x31, tlv(0x30, tlv(0x06, Buffer.from([0x55, 0x04, 0x03])), tlv(0x0c, Buffer.from(`agent ${machineId}`)))),
  );
  const serial = randomBytes(16);
  serial[0] = ((serial[0] as number) & 0x7f) | 0x01; // positive, no leading zero
  const now = Date.now();
  const tbs = tlv(
    0x30,
    tlv(0xa0, tlv(0x02, Buffer.from([2]))), // v3
    tlv(0x02, serial),
    ed25519,
    name,
    // An hour back, as clocks disagree; a year on, as an agent lives for hours.
    tlv(0x30, utcTime(new Date(now - 3_600_000)), utcTime(new Date(now + 365 * 86_400_000))),
    name,
    createPublicKey(privateKey).export({ type: 'spki', format: 'der' }),
  );
  const der = tlv(0x30, tbs, ed25519, tlv(0x03, Buffer.from([0]), sign(null, tbs, privateKey)));
  return pem(der);
}

/** A DER certificate as PEM. */
export function pem(der: Uint8Array): string {
  const base64 = Buffer.from(der).toString('base64');
  return `-----BEGIN CERTIFICATE-----\n${base64.match(/.{1,64}/g)?.join('\n') ?? ''}\n-----END CERTIFICATE-----\n`;
}

function tlv(tag: number, ...contents: Buffer[]): Buffer {
  const value = Buffer.concat(contents);
  const length =
    value.length < 0x80
      ? Buffer.from([value.length])
      : value.length < 0x100
        ? Buffer.from([0x81, value.length])
        : Buffer.from([0x82, value.length >> 8, value.length & 0xff]);
  return Buffer.concat([Buffer.from([tag]), length, value]);
}

function utcTime(date: Date): Buffer {
  return tlv(0x17, Buffer.from(`${date.toISOString().replace(/[-:T]/g, '').slice(2, 14)}Z`));
}
