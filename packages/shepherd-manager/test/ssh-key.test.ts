import { execFile } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startTestSshServer } from '../../../test/support/sshd.js';
import { Ssh2Client, SshKey, SshKeyError } from '../src/index.js';

const execFileAsync = promisify(execFile);
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ssh-key-test-'));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A key as the Go shepherd persisted it: crypto/ed25519.PrivateKey, seed ‖ public key. */
function goRawKey(publicKeyStartsWith?: number): Buffer {
  for (;;) {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    const seed = Buffer.from(privateKey.export({ format: 'jwk' }).d ?? '', 'base64url');
    const pub = Buffer.from(publicKey.export({ format: 'jwk' }).x ?? '', 'base64url');
    if (publicKeyStartsWith === undefined || pub[0] === publicKeyStartsWith) return Buffer.concat([seed, pub]);
  }
}

async function errorOf(promise: Promise<unknown>): Promise<SshKeyError> {
  const error = await promise.catch((e: unknown) => e);
  expect(error).toBeInstanceOf(SshKeyError);
  return error as SshKeyError;
}

describe('SshKey', () => {
  test('generates an OpenSSH ed25519 key with mode 0400, creating its directory', async () => {
    const keyPath = path.join(dir, 'new', 'deeper', 'id_ed25519');
    const key = await SshKey.loadOrGenerate(keyPath, { comment: 'shepherd@test' });
    expect(key.source).toBe('generated');
    expect(key.path).toBe(keyPath);
    expect((await stat(keyPath)).mode & 0o777).toBe(0o400);
    const contents = await readFile(keyPath, 'utf8');
    expect(contents).toMatch(/^-----BEGIN OPENSSH PRIVATE KEY-----\n/);
    expect(contents).toBe(key.privateKey);
    expect(key.authorizedKey).toMatch(/^ssh-ed25519 AAAAC3NzaC1lZDI1NTE5[A-Za-z0-9+/]+=* shepherd@test$/);
    expect(key.fingerprint).toMatch(/^SHA256:[A-Za-z0-9+/]{43}$/);

    // OpenSSH itself reads the file and derives the same public key and fingerprint.
    const { stdout: publicKey } = await execFileAsync('ssh-keygen', ['-y', '-f', keyPath]);
    expect(publicKey.trim().split(' ').slice(0, 2)).toEqual(key.authorizedKey.split(' ').slice(0, 2));
    const { stdout: fingerprint } = await execFileAsync('ssh-keygen', ['-l', '-E', 'sha256', '-f', keyPath]);
    expect(fingerprint.split(' ')[1]).toBe(key.fingerprint);
  });

  test('loading again yields the same key and leaves the file alone', async () => {
    const keyPath = path.join(dir, 'reload');
    const generated = await SshKey.loadOrGenerate(keyPath);
    const before = await stat(keyPath);
    const loaded = await SshKey.loadOrGenerate(keyPath);
    expect(loaded.source).toBe('openssh');
    expect(loaded.privateKey).toBe(generated.privateKey);
    expect(loaded.authorizedKey).toBe(generated.authorizedKey);
    expect((await stat(keyPath)).mtimeMs).toBe(before.mtimeMs);
  });

  test('concurrent first loads agree on one key, and never see a half-written file', async () => {
    for (let round = 0; round < 5; round++) {
      const raceDir = path.join(dir, `race-${round}`);
      const keyPath = path.join(raceDir, 'id_ed25519');
      const keys = await Promise.all(Array.from({ length: 8 }, () => SshKey.loadOrGenerate(keyPath)));
      expect(new Set(keys.map((key) => key.authorizedKey)).size).toBe(1);
      expect(keys.filter((key) => key.source === 'generated')).toHaveLength(1);
      expect(await readdir(raceDir)).toEqual(['id_ed25519']);
    }
  });

  test('reads the raw 64-byte key files of the Go shepherd, into a key OpenSSH accepts', async () => {
    const keyPath = path.join(dir, 'go-key');
    await writeFile(keyPath, goRawKey(), { mode: 0o400 });
    const key = await SshKey.loadOrGenerate(keyPath, { comment: 'from-go' });
    expect(key.source).toBe('raw-ed25519');
    expect(key.authorizedKey).toMatch(/^ssh-ed25519 AAAA\S+ from-go$/);
    // Never rewritten: the Go shepherd can still read it.
    expect(await readFile(keyPath)).toHaveLength(64);

    const converted = path.join(dir, 'go-key-converted');
    await writeFile(converted, key.privateKey, { mode: 0o600 });
    const { stdout } = await execFileAsync('ssh-keygen', ['-y', '-f', converted]);
    expect(stdout.trim().split(' ').slice(0, 2)).toEqual(key.authorizedKey.split(' ').slice(0, 2));
  });

  test('keeps the leading zero bytes of a public key (ssh2 keygen drops them: mscdex/ssh2#1390)', async () => {
    const keyPath = path.join(dir, 'go-key-leading-zero');
    const raw = goRawKey(0);
    await writeFile(keyPath, raw, { mode: 0o400 });
    const key = await SshKey.loadOrGenerate(keyPath);
    const blob = Buffer.from(key.authorizedKey.split(' ')[1] ?? '', 'base64');
    expect(blob.subarray(-32)).toEqual(raw.subarray(32));
    expect(blob.readUInt32BE(blob.length - 36)).toBe(32);

    const converted = path.join(dir, 'go-key-leading-zero-converted');
    await writeFile(converted, key.privateKey, { mode: 0o600 });
    const { stdout } = await execFileAsync('ssh-keygen', ['-y', '-f', converted]);
    expect(stdout.trim().split(' ').slice(0, 2)).toEqual(key.authorizedKey.split(' ').slice(0, 2));
  });

  test('a Go key file authenticates to the SSH server', async () => {
    const keyPath = path.join(dir, 'go-key-login');
    await writeFile(keyPath, goRawKey(), { mode: 0o400 });
    const key = await SshKey.loadOrGenerate(keyPath);
    const server = await startTestSshServer({ authorizedKeys: [key.authorizedKey] });
    console.log(server.description);
    try {
      const connection = await new Ssh2Client({ privateKey: key.privateKey }).dial(
        { host: server.host, port: server.port },
        { connectTimeout: 5_000 },
      );
      try {
        const result = await connection.execute('echo hello', new Uint8Array());
        expect(new TextDecoder().decode(result.stdout)).toBe('hello\n');
      } finally {
        await connection.close();
      }
    } finally {
      await server.stop();
    }
  });

  test('a 64-byte file that is not seed ‖ public key is refused', async () => {
    const keyPath = path.join(dir, 'go-key-bad');
    const raw = goRawKey();
    raw[40] = (raw[40] ?? 0) ^ 0xff;
    await writeFile(keyPath, raw);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.path).toBe(keyPath);
    expect(error.message).toContain(keyPath);
    expect(error.message).toContain('public half does not match');
  });

  test.each([
    [
      'garbage',
      Buffer.from('not a key at all\n'),
      /neither an OpenSSH private key nor a raw 64-byte ed25519 key \(17 bytes\)/,
    ],
    ['an empty file', Buffer.alloc(0), /\(0 bytes\)/],
    [
      'a truncated OpenSSH key',
      Buffer.from('-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n'),
      /cannot parse: Unsupported key format/,
    ],
  ])('%s is refused with SshKeyError and left in place', async (name, contents, problem) => {
    const keyPath = path.join(dir, `malformed-${name.replaceAll(' ', '-')}`);
    await writeFile(keyPath, contents);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.message).toContain(keyPath);
    expect(error.message).toMatch(problem);
    expect(await readFile(keyPath)).toEqual(contents);
  });

  test('an RSA key is refused: the shepherd uses ed25519', async () => {
    const keyPath = path.join(dir, 'rsa');
    await execFileAsync('ssh-keygen', ['-q', '-t', 'rsa', '-b', '2048', '-N', '', '-f', keyPath]);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.message).toContain(keyPath);
    expect(error.message).toContain('ssh-rsa');
  });

  test('a passphrase-protected key is refused', async () => {
    const keyPath = path.join(dir, 'encrypted');
    await execFileAsync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', 'secret', '-f', keyPath]);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.message).toContain(keyPath);
    expect(error.message).toMatch(/passphrase|encrypted/i);
  });

  test('a public key file is refused', async () => {
    const keyPath = path.join(dir, 'public-only');
    const { authorizedKey } = await SshKey.loadOrGenerate(path.join(dir, 'for-public'));
    await writeFile(keyPath, `${authorizedKey}\n`);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.message).toContain(keyPath);
  });

  test('an unreadable path is an SshKeyError, not a reason to generate', async () => {
    const keyPath = path.join(dir, 'a-directory');
    await mkdir(keyPath);
    const error = await errorOf(SshKey.loadOrGenerate(keyPath));
    expect(error.message).toContain(`SSH key ${keyPath}: cannot read`);
  });
});
