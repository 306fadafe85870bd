import { createPublicKey, type KeyObject, randomBytes, sign } from 'node:crypto';
import { isIP } from 'node:net';

/**
 * Self-signed X.509 certificates, DER-encoded by hand: Node can read
 * certificates but not make them, the `openssl` command may be missing, and
 * the maintained npm packages do not all sign with ed25519. What is written
 * here is the little a self-signed certificate needs (RFC 5280): a v3
 * TBSCertificate with one common name, a validity, the key, and optionally
 * subject alternative names and a CA flag, signed with the key itself.
 */
export interface SelfSignedOptions {
  /** Subject and issuer common name. */
  readonly commonName: string;
  /** DNS names and IP addresses the certificate is for (subjectAltName). */
  readonly altNames?: readonly string[];
  /** Marks it a CA (basicConstraints cA), so it can be trusted as its own root. */
  readonly ca?: boolean;
  /** Validity start; default an hour ago (clocks disagree). */
  readonly notBefore?: Date;
  /** Validity end; default 10 years after `notBefore`. */
  readonly notAfter?: Date;
}

/** OIDs, as their DER contents. */
const OID = {
  ed25519: '1.3.101.112',
  ecdsaWithSha256: '1.2.840.10045.4.3.2',
  commonName: '2.5.4.3',
  subjectAltName: '2.5.29.17',
  basicConstraints: '2.5.29.19',
};

/**
 * A self-signed certificate for `privateKey` (ed25519, or EC P-256 signed
 * with ECDSA-SHA256), DER-encoded.
 */
export function selfSignedCertificate(privateKey: KeyObject, options: SelfSignedOptions): Buffer {
  const type = privateKey.asymmetricKeyType;
  if (type !== 'ed25519' && type !== 'ec') {
    throw new TypeError(`self-signed certificate: key type ${String(type)} is not ed25519 or EC`);
  }
  const algorithm = sequence(oid(type === 'ed25519' ? OID.ed25519 : OID.ecdsaWithSha256));
  const spki = createPublicKey(privateKey).export({ type: 'spki', format: 'der' });
  const name = sequence(set(sequence(oid(OID.commonName), tlv(0x0c, Buffer.from(options.commonName, 'utf8')))));
  const notBefore = options.notBefore ?? new Date(Date.now() - 3_600_000);
  const notAfter = options.notAfter ?? new Date(notBefore.getTime() + 10 * 365 * 86_400_000);
  const extensions: Buffer[] = [];
  if (options.ca) {
    extensions.push(
      sequence(oid(OID.basicConstraints), tlv(0x01, Buffer.from([0xff])), octets(sequence(boolean(true)))),
    );
  }
  if (options.altNames?.length) {
    const names = options.altNames.map((altName) => {
      if (isIP(altName) === 4) return tlv(0x87, Buffer.from(altName.split('.').map(Number)));
      if (isIP(altName) === 6) return tlv(0x87, ipv6Bytes(altName));
      return tlv(0x82, Buffer.from(altName, 'ascii'));
    });
    extensions.push(sequence(oid(OID.subjectAltName), octets(sequence(...names))));
  }
  // A positive serial of 16 random bytes: the top bit cleared, the first byte non-zero.
  const serial = randomBytes(16);
  serial[0] = ((serial[0] ?? 0) & 0x7f) | 0x01;
  const tbs = sequence(
    tlv(0xa0, integer(Buffer.from([2]))),
    integer(serial),
    algorithm,
    name,
    sequence(time(notBefore), time(notAfter)),
    name,
    spki,
    ...(extensions.length ? [tlv(0xa3, sequence(...extensions))] : []),
  );
  const signature = sign(type === 'ed25519' ? null : 'sha256', tbs, privateKey);
  return sequence(tbs, algorithm, tlv(0x03, Buffer.concat([Buffer.from([0]), signature])));
}

/** PEM armour of a DER certificate. */
export function certificatePem(der: Uint8Array): string {
  const lines =
    Buffer.from(der)
      .toString('base64')
      .match(/.{1,64}/g) ?? [];
  return `-----BEGIN CERTIFICATE-----\n${lines.join('\n')}\n-----END CERTIFICATE-----\n`;
}

function tlv(tag: number, value: Buffer): Buffer {
  const length = value.length;
  let header: number[];
  if (length < 0x80) header = [tag, length];
  else {
    const bytes: number[] = [];
    for (let rest = length; rest > 0; rest = Math.floor(rest / 256)) bytes.unshift(rest % 256);
    header = [tag, 0x80 | bytes.length, ...bytes];
  }
  return Buffer.concat([Buffer.from(header), value]);
}

const sequence = (...items: Buffer[]) => tlv(0x30, Buffer.concat(items));
const set = (...items: Buffer[]) => tlv(0x31, Buffer.concat(items));
const octets = (value: Buffer) => tlv(0x04, value);
const boolean = (value: boolean) => tlv(0x01, Buffer.from([value ? 0xff : 0]));

/** A non-negative INTEGER from big-endian bytes. */
function integer(bytes: Buffer): Buffer {
  return tlv(0x02, (bytes[0] ?? 0) & 0x80 ? Buffer.concat([Buffer.from([0]), bytes]) : bytes);
}

function oid(dotted: string): Buffer {
  const [first = 0, second = 0, ...rest] = dotted.split('.').map(Number);
  const bytes = [first * 40 + second];
  for (const arc of rest) {
    const base128: number[] = [arc % 128];
    for (let value = Math.floor(arc / 128); value > 0; value = Math.floor(value / 128)) {
      base128.unshift((value % 128) | 0x80);
    }
    bytes.push(...base128);
  }
  return tlv(0x06, Buffer.from(bytes));
}

/** UTCTime until 2049, GeneralizedTime from 2050 (RFC 5280 §4.1.2.5). */
function time(date: Date): Buffer {
  const iso = date.toISOString().replace(/[-:T]/g, '').slice(0, 14);
  const year = date.getUTCFullYear();
  return year < 2050 ? tlv(0x17, Buffer.from(`${iso.slice(2)}Z`)) : tlv(0x18, Buffer.from(`${iso}Z`));
}

/** The 16 bytes of an IPv6 address in hex groups (`::1`, `fd00::7`; no dotted IPv4 tail). */
function ipv6Bytes(address: string): Buffer {
  const [head = '', tail = ''] = address.split('::');
  const groups = (part: string) => (part ? part.split(':') : []);
  const left = groups(head);
  const right = address.includes('::') ? groups(tail) : [];
  const middle = Array(8 - left.length - right.length).fill('0');
  const all = [...left, ...middle, ...right];
  const bytes = Buffer.alloc(16);
  for (const [i, group] of all.entries()) bytes.writeUInt16BE(Number.parseInt(group, 16), i * 2);
  return bytes;
}
