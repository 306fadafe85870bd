import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  randomBytes,
} from 'node:crypto';
import { chmod, link, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { describeError } from '@bmaas/common';
import createDebug from 'debug';
import ssh2 from 'ssh2';
import { ShepherdError } from './provider.js';

// ssh2 is CommonJS; Node's ESM loader cannot see `utils` as a named export (Vite's interop can).
const { utils } = ssh2;

const log = createDebug('shepherd:ssh');

const ED25519 = 'ssh-ed25519';
// The original Go shepherd persisted crypto/ed25519.PrivateKey as is: seed ‖ public key.
const RAW_KEY_LENGTH = 64;
const SEED_LENGTH = 32;
// PKCS#8 DER header of an ed25519 private key (RFC 8410); the 32-byte seed follows.
const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

/** Where an {@link SshKey} came from. */
export type SshKeySource = 'generated' | 'openssh' | 'raw-ed25519';

/** Options of {@link SshKey.loadOrGenerate}. */
export interface SshKeyOptions {
  /**
   * Comment of the public key in authorized_keys form, and of a generated
   * key file. A loaded OpenSSH key keeps its own comment if it has one.
   * Default: `shepherd`.
   */
  readonly comment?: string;
}

/** The key file at `path` is unusable; the message says why. It is never overwritten. */
export class SshKeyError extends ShepherdError {
  override name = 'SshKeyError';
  constructor(
    readonly path: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`SSH key ${path}: ${problem}`, options);
  }
}

/**
 * The shepherd's SSH identity: an ed25519 key it logs in to machines with,
 * persisted at a path so that providers can install its public key once.
 */
export class SshKey {
  private constructor(
    /** The file the key was loaded from or saved to. */
    readonly path: string,
    /** The private key in OpenSSH format, as ssh2's `privateKey` option takes it. */
    readonly privateKey: string,
    /** The public key in authorized_keys form: `ssh-ed25519 AAAA… comment`. */
    readonly authorizedKey: string,
    /** The public key's fingerprint as OpenSSH prints it: `SHA256:…`. */
    readonly fingerprint: string,
    readonly source: SshKeySource,
  ) {}

  /**
   * Loads the key at `path`, or generates one and saves it there (mode 0400,
   * creating the directory) when the file does not exist. Reads OpenSSH
   * private keys and the raw 64-byte ed25519 keys the Go shepherd wrote.
   *
   * @throws {@link SshKeyError} when the file cannot be read, is not an
   *   unencrypted ed25519 private key, or a new key cannot be saved
   */
  static async loadOrGenerate(path: string, options: SshKeyOptions = {}): Promise<SshKey> {
    const comment = options.comment ?? 'shepherd';
    const existing = await readKeyFile(path);
    if (existing) return SshKey.#parse(path, existing, comment);

    // Not ssh2's generateKeyPairSync: it drops leading zero bytes of the public key,
    // making one key in 256 unreadable (mscdex/ssh2#1390).
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url');
    const generated = openSshPrivateKey(seed, rawPublicKey(publicKey), comment);
    let saved: boolean;
    try {
      await mkdir(dirname(path), { recursive: true, mode: 0o700 });
      saved = await saveNewFile(path, generated);
    } catch (error) {
      throw new SshKeyError(path, `cannot save a generated key: ${describeError(error)}`, { cause: error });
    }
    // Another process saved one first: use that.
    if (!saved) return SshKey.loadOrGenerate(path, options);
    const key = SshKey.#parse(path, Buffer.from(generated), comment, 'generated');
    log('generated SSH key %s at %s', key.fingerprint, path);
    return key;
  }

  static #parse(path: string, data: Buffer, comment: string, source?: SshKeySource): SshKey {
    if (data.subarray(0, 11).toString('latin1') === '-----BEGIN ') {
      const parsed = utils.parseKey(data);
      if (parsed instanceof Error) throw new SshKeyError(path, `cannot parse: ${parsed.message}`, { cause: parsed });
      if (!parsed.isPrivateKey()) throw new SshKeyError(path, 'holds no private key');
      if (parsed.type !== ED25519) throw new SshKeyError(path, `is a ${parsed.type} key, want ${ED25519}`);
      const blob = parsed.getPublicSSH();
      const key = new SshKey(
        path,
        data.toString('utf8'),
        authorizedKeyLine(blob, parsed.comment || comment),
        sshFingerprint(blob),
        source ?? 'openssh',
      );
      if (!source) log('loaded SSH key %s from %s', key.fingerprint, path);
      return key;
    }
    if (data.length === RAW_KEY_LENGTH) {
      const seed = data.subarray(0, SEED_LENGTH);
      const publicKey = ed25519PublicKeyOf(seed);
      if (!publicKey.equals(data.subarray(SEED_LENGTH))) {
        throw new SshKeyError(path, 'is 64 bytes but not an ed25519 key: its public half does not match its seed');
      }
      const blob = sshString(Buffer.from(ED25519), publicKey);
      const key = new SshKey(
        path,
        openSshPrivateKey(seed, publicKey, comment),
        authorizedKeyLine(blob, comment),
        sshFingerprint(blob),
        'raw-ed25519',
      );
      log('loaded raw ed25519 SSH key %s from %s (written by the Go shepherd)', key.fingerprint, path);
      return key;
    }
    throw new SshKeyError(
      path,
      `is neither an OpenSSH private key nor a raw ${RAW_KEY_LENGTH}-byte ed25519 key (${data.length} bytes)`,
    );
  }
}

/** The OpenSSH-style fingerprint (`SHA256:` and unpadded base64) of a public key in SSH wire format. */
export function sshFingerprint(publicKeyBlob: Uint8Array): string {
  return `SHA256:${createHash('sha256').update(publicKeyBlob).digest('base64').replace(/=+$/, '')}`;
}

/**
 * Saves `contents` (mode 0400) at `path` unless a file is there; false if one is.
 * The file appears complete or not at all, so a concurrent reader never sees
 * it half-written.
 */
async function saveNewFile(path: string, contents: string): Promise<boolean> {
  const temporary = `${path}.${randomBytes(6).toString('hex')}.tmp`;
  try {
    await writeFile(temporary, contents, { flag: 'wx', mode: 0o400 });
    // The umask only ever narrows the mode; make it exactly 0400 anyway.
    await chmod(temporary, 0o400);
    // Unlike rename, link refuses to replace an existing file.
    await link(temporary, path);
    return true;
  } catch (error) {
    if (errorCode(error) === 'EEXIST') return false;
    throw error;
  } finally {
    await rm(temporary, { force: true });
  }
}

async function readKeyFile(path: string): Promise<Buffer | undefined> {
  try {
    return await readFile(path);
  } catch (error) {
    if (errorCode(error) === 'ENOENT') return undefined;
    throw new SshKeyError(path, `cannot read: ${describeError(error)}`, { cause: error });
  }
}

function authorizedKeyLine(blob: Uint8Array, comment: string): string {
  const line = `${ED25519} ${Buffer.from(blob).toString('base64')}`;
  return comment ? `${line} ${comment}` : line;
}

function ed25519PublicKeyOf(seed: Buffer): Buffer {
  const privateKey = createPrivateKey({
    key: Buffer.concat([PKCS8_ED25519_PREFIX, seed]),
    format: 'der',
    type: 'pkcs8',
  });
  return rawPublicKey(createPublicKey(privateKey));
}

function rawPublicKey(publicKey: KeyObject): Buffer {
  return Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
}

/** Encodes an unencrypted ed25519 key in the OpenSSH private key format (PROTOCOL.key). */
function openSshPrivateKey(seed: Buffer, publicKey: Buffer, comment: string): string {
  const keyType = Buffer.from(ED25519);
  const checkInt = randomBytes(4);
  const section = Buffer.concat([
    checkInt,
    checkInt,
    sshString(keyType),
    sshString(publicKey),
    sshString(Buffer.concat([seed, publicKey])),
    sshString(Buffer.from(comment)),
  ]);
  // Padded to the cipher block size ("none": 8) with the bytes 1, 2, 3, …
  const padding = Buffer.from(Array.from({ length: (8 - (section.length % 8)) % 8 }, (_, i) => i + 1));
  const none = Buffer.from('none');
  const body = Buffer.concat([
    Buffer.from('openssh-key-v1\0'),
    sshString(none),
    sshString(none),
    sshString(Buffer.alloc(0)),
    uint32(1),
    sshString(sshString(keyType, publicKey)),
    sshString(Buffer.concat([section, padding])),
  ]);
  const lines = body.toString('base64').match(/.{1,70}/g) ?? [];
  return ['-----BEGIN OPENSSH PRIVATE KEY-----', ...lines, '-----END OPENSSH PRIVATE KEY-----', ''].join('\n');
}

/** Concatenates SSH wire-format strings (uint32 length, then the bytes). */
function sshString(...values: Buffer[]): Buffer {
  return Buffer.concat(values.flatMap((value) => [uint32(value.length), value]));
}

function uint32(value: number): Buffer {
  const buffer = Buffer.alloc(4);
  buffer.writeUInt32BE(value);
  return buffer;
}

function errorCode(error: unknown): unknown {
  return error instanceof Error && 'code' in error ? error.code : undefined;
}
