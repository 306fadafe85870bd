import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, closeSync, existsSync, fchmodSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import ssh2, { type Connection, type ParsedKey, type ServerChannel, type SFTPWrapper } from 'ssh2';
import { freePort } from './ports.js';

// ssh2 is CommonJS; Node's ESM loader sees neither `Server` nor `utils` as named exports.
const { Server, utils } = ssh2;

/** Where Debian's `openssh-server` installs the daemon. */
export const SSHD_PATH = '/usr/sbin/sshd';

/** What a suite prints when it runs against the fallback server. */
export const FALLBACK_NOTICE = "sshd not found, using ssh2's in-process server";

/** A throwaway SSH server on 127.0.0.1 that lets in whoever holds one of the given keys, as root. */
export interface TestSshServer {
  /** `openssh`: a real `sshd`; `ssh2`: ssh2's in-process server, where no sshd is installed. */
  readonly kind: 'openssh' | 'ssh2';
  /** One line for the test output saying which server this is. */
  readonly description: string;
  readonly host: string;
  readonly port: number;
  /** The server's host key fingerprint, `SHA256:…` (from ssh-keygen for OpenSSH). */
  readonly hostKeyFingerprint: string;
  /** What the server logged so far (OpenSSH: its stderr at LogLevel VERBOSE). */
  logs(): string;
  stop(): Promise<void>;
}

export interface TestSshServerOptions {
  /** Public keys in authorized_keys form. */
  readonly authorizedKeys: readonly string[];
  /**
   * Loopback addresses to listen on, all on the same port, so that one
   * server stands in for several machines. Default `['127.0.0.1']`.
   */
  readonly listenAddresses?: readonly string[];
}

/**
 * Which server {@link startTestSshServer} starts, by `SHEPHERD_TEST_SSHD`:
 * unset, OpenSSH when it is installed, else the fallback; `fallback`, ssh2's
 * in-process server even where OpenSSH is installed (CI runs the SSH tests
 * this way too); `openssh`, OpenSSH or an error (CI, so that a missing sshd
 * cannot pass unnoticed).
 */
export function testSshServerKind(): 'openssh' | 'ssh2' {
  const wanted = process.env.SHEPHERD_TEST_SSHD ?? '';
  switch (wanted) {
    case 'fallback':
      return 'ssh2';
    case 'openssh':
      if (!existsSync(SSHD_PATH)) {
        throw new Error(`SHEPHERD_TEST_SSHD=openssh, but ${SSHD_PATH} does not exist (Debian: openssh-server)`);
      }
      return 'openssh';
    case '':
      return existsSync(SSHD_PATH) ? 'openssh' : 'ssh2';
    default:
      throw new Error(`SHEPHERD_TEST_SSHD=${JSON.stringify(wanted)}: expected fallback, openssh, or unset`);
  }
}

/** Starts a throwaway SSH server; see {@link TestSshServer}. Stop it in the suite's teardown. */
export function startTestSshServer(options: TestSshServerOptions): Promise<TestSshServer> {
  return testSshServerKind() === 'openssh' ? startOpenSsh(options) : startInProcess(options);
}

const execFileAsync = promisify(execFile);

async function startOpenSsh({ authorizedKeys, listenAddresses }: TestSshServerOptions): Promise<TestSshServer> {
  const addresses = listenAddresses ?? ['127.0.0.1'];
  const host = addresses[0] ?? '127.0.0.1';
  const dir = await mkdtemp(path.join(tmpdir(), 'test-sshd-'));
  try {
    // sshd insists on its privilege separation directory.
    await mkdir('/run/sshd', { recursive: true, mode: 0o755 });
    const hostKey = path.join(dir, 'ssh_host_ed25519_key');
    await execFileAsync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'test-sshd', '-f', hostKey]);
    const { stdout } = await execFileAsync('ssh-keygen', ['-l', '-E', 'sha256', '-f', `${hostKey}.pub`]);
    const hostKeyFingerprint = stdout.split(' ')[1] ?? '';
    const authorizedKeysFile = path.join(dir, 'authorized_keys');
    await writeFile(authorizedKeysFile, authorizedKeys.map((line) => `${line}\n`).join(''), { mode: 0o600 });
    const version = await sshdVersion();

    // A port picked here can be taken before sshd binds it; then try another.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const config = path.join(dir, 'sshd_config');
      await writeFile(
        config,
        [
          `Port ${port}`,
          ...addresses.map((address) => `ListenAddress ${address}`),
          `HostKey ${hostKey}`,
          `PidFile ${path.join(dir, 'sshd.pid')}`,
          `AuthorizedKeysFile ${authorizedKeysFile}`,
          'StrictModes no',
          'UsePAM no',
          'PubkeyAuthentication yes',
          'PasswordAuthentication no',
          'KbdInteractiveAuthentication no',
          'PermitRootLogin prohibit-password',
          'Subsystem sftp internal-sftp',
          'PrintMotd no',
          'UseDNS no',
          'LogLevel VERBOSE',
          // OpenSSH 9.8 penalizes sources whose connections fail; tests fail connections on purpose.
          ...(version >= 9.8 ? ['PerSourcePenalties no'] : []),
          '',
        ].join('\n'),
      );
      // Its own process group, so that stop() also ends the per-connection children.
      const child = spawn(SSHD_PATH, ['-D', '-e', '-f', config], {
        stdio: ['ignore', 'ignore', 'pipe'],
        detached: true,
      });
      const log = captureLog(child);
      try {
        for (const address of addresses) await waitForBanner(address, port, child, 10_000);
      } catch (error) {
        await stopProcessGroup(child);
        if (attempt < 3 && /Address already in use/.test(log.text())) continue;
        throw new Error(`sshd did not start: ${(error as Error).message}\n${log.text()}`);
      }
      return {
        kind: 'openssh',
        description: `OpenSSH sshd ${version} (${SSHD_PATH}) on ${addresses.join(', ')} port ${port}`,
        host,
        port,
        hostKeyFingerprint,
        logs: log.text,
        stop: async () => {
          await stopProcessGroup(child);
          await rm(dir, { recursive: true, force: true });
        },
      };
    }
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}

async function sshdVersion(): Promise<number> {
  // `sshd -V` prints the version (to stderr) and exits; older ones print it with their usage.
  const output = await new Promise<string>((resolve) =>
    execFile(SSHD_PATH, ['-V'], (_error, stdout, stderr) => resolve(`${stdout}${stderr}`)),
  );
  const match = /OpenSSH_(\d+)\.(\d+)/.exec(output);
  return match ? Number(`${match[1]}.${match[2]}`) : 0;
}

function captureLog(child: ChildProcess): { text: () => string } {
  let text = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    text = (text + chunk).slice(-64 * 1024);
  });
  return { text: () => text };
}

/** Resolves once the port accepts connections and sends an SSH banner. */
async function waitForBanner(host: string, port: number, child: ChildProcess, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let exited = false;
  child.once('exit', () => {
    exited = true;
  });
  while (Date.now() < deadline) {
    if (exited) throw new Error(`sshd exited with ${child.exitCode ?? child.signalCode}`);
    if (await readsBanner(host, port)) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`no SSH banner on ${host}:${port} within ${timeoutMs} ms`);
}

function readsBanner(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, host);
    let received = '';
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1000, () => done(false));
    socket.on('error', () => done(false));
    socket.on('data', (chunk) => {
      received += chunk.toString('latin1');
      if (received.includes('\n')) done(received.startsWith('SSH-2.0-'));
    });
    socket.on('end', () => done(false));
  });
}

async function stopProcessGroup(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const pid = child.pid;
  const signalGroup = (signal: NodeJS.Signals) => {
    try {
      process.kill(-pid, signal);
    } catch {}
  };
  signalGroup('SIGTERM');
  const timer = setTimeout(() => signalGroup('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
  // The listener's exit does not end the per-connection processes; the group signal did, or now does.
  signalGroup('SIGKILL');
}

/**
 * ssh2's server, standing in for sshd: public-key authentication, exec
 * through /bin/sh with the caller's privileges, and the SFTP requests an
 * upload needs (open, write, close, chmod).
 */
async function startInProcess({ authorizedKeys, listenAddresses }: TestSshServerOptions): Promise<TestSshServer> {
  const [host = '127.0.0.1', ...moreAddresses] = listenAddresses ?? ['127.0.0.1'];
  const { hostKey, parsedHostKey } = ed25519HostKey();
  const allowed = authorizedKeys.map((line) => {
    const key = utils.parseKey(line);
    if (key instanceof Error) throw new Error(`bad authorized key ${line}: ${key.message}`);
    return key;
  });
  const logLines: string[] = [];
  const connections = new Set<Connection>();
  const children = new Set<ChildProcess>();

  const server = new Server({ hostKeys: [hostKey.private] }, (client) => {
    connections.add(client);
    // Answers go out at once, not after the client's delayed ACK (Nagle's algorithm).
    (client as Connection & { setNoDelay(noDelay: boolean): void }).setNoDelay(true);
    client.on('close', () => connections.delete(client));
    client.on('error', (error) => logLines.push(`client error: ${error.message}`));
    client.on('authentication', (context) => {
      if (context.method !== 'publickey') return context.reject(['publickey']);
      const key = allowed.find((candidate) => candidate.getPublicSSH().equals(context.key.data));
      const signed = context.signature && context.blob;
      if (
        !key ||
        (signed && context.blob && context.signature && !key.verify(context.blob, context.signature, context.hashAlgo))
      ) {
        logLines.push(`rejected key for ${context.username}`);
        return context.reject(['publickey']);
      }
      context.accept();
    });
    client.on('ready', () => {
      client.on('session', (acceptSession) => {
        const session = acceptSession();
        let command: ChildProcess | undefined;
        session.on('exec', (accept, _reject, info) => {
          const channel = accept();
          command = runCommand(info.command, channel, children);
        });
        session.on('signal', (accept, _reject, info) => {
          accept?.();
          command?.kill(`SIG${info.name}` as NodeJS.Signals);
        });
        session.on('sftp', (accept) => {
          const sftp = accept();
          announcePosixRename(sftp);
          serveSftp(sftp);
        });
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const address = server.address();
  if (!address || typeof address !== 'object') throw new Error('in-process SSH server has no port');
  // The other addresses on the same port hand their connections to the one server.
  const extraListeners = await Promise.all(
    moreAddresses.map(
      (extra) =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const listener = createServer((socket) => server.injectSocket(socket));
          listener.once('error', reject);
          listener.listen(address.port, extra, () => resolve(listener));
        }),
    ),
  );
  return {
    kind: 'ssh2',
    description: `${existsSync(SSHD_PATH) ? "SHEPHERD_TEST_SSHD=fallback: using ssh2's in-process server" : FALLBACK_NOTICE} (${[host, ...moreAddresses].join(', ')} port ${address.port})`,
    host,
    port: address.port,
    hostKeyFingerprint: `SHA256:${createHash('sha256').update(parsedHostKey.getPublicSSH()).digest('base64').replace(/=+$/, '')}`,
    logs: () => logLines.join('\n'),
    stop: async () => {
      for (const child of children) child.kill('SIGKILL');
      for (const connection of connections) connection.end();
      await Promise.all(extraListeners.map((listener) => new Promise((resolve) => listener.close(resolve))));
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** An ed25519 key from ssh2's generator, which makes one key in 256 unreadable (mscdex/ssh2#1390): retry. */
function ed25519HostKey(): { hostKey: { private: string }; parsedHostKey: ParsedKey } {
  for (;;) {
    const hostKey = utils.generateKeyPairSync('ed25519');
    const parsedHostKey = utils.parseKey(hostKey.public);
    if (!(parsedHostKey instanceof Error) && !(utils.parseKey(hostKey.private) instanceof Error)) {
      return { hostKey, parsedHostKey };
    }
  }
}

function runCommand(command: string, channel: ServerChannel, children: Set<ChildProcess>): ChildProcess {
  const child = spawn('/bin/sh', ['-c', command], { stdio: 'pipe' });
  children.add(child);
  channel.pipe(child.stdin);
  child.stdin.on('error', () => {});
  child.stdout.pipe(channel, { end: false });
  child.stderr.pipe(channel.stderr, { end: false });
  child.on('close', (code, signal) => {
    children.delete(child);
    if (signal) channel.exit(signal.replace(/^SIG/, ''), false, '');
    else channel.exit(code ?? 255);
    channel.end();
  });
  // Unlike sshd, which leaves the command running; tidier for tests.
  channel.on('close', () => child.kill('SIGKILL'));
  return child;
}

const POSIX_RENAME = 'posix-rename@openssh.com';
const SSH_FXP_VERSION = 2;
/** SFTP channels (per connection's protocol) whose VERSION answer is still to be sent. */
const awaitingVersion = new WeakMap<object, Set<number>>();

/**
 * OpenSSH's SFTP server offers posix-rename@openssh.com, a rename that
 * atomically replaces the target, and the shepherd's upload relies on it when
 * several uploads replace one file at once. ssh2's server cannot announce an
 * extension, so the announcement is appended to its VERSION answer on the way
 * out (through ssh2 internals; this fails loudly should they change).
 */
function announcePosixRename(sftp: SFTPWrapper): void {
  type Send = (channel: number, data: Buffer) => void;
  const internals = sftp as unknown as { _protocol?: { channelData?: Send }; outgoing?: { id?: unknown } };
  const protocol = internals._protocol;
  const channel = internals.outgoing?.id;
  const send = protocol?.channelData;
  if (!protocol || typeof send !== 'function' || typeof channel !== 'number') {
    throw new Error(`ssh2 internals changed: the in-process SSH server cannot announce ${POSIX_RENAME}`);
  }
  let channels = awaitingVersion.get(protocol);
  if (!channels) {
    const pending = new Set<number>();
    channels = pending;
    awaitingVersion.set(protocol, pending);
    protocol.channelData = function (this: unknown, id: number, data: Buffer) {
      // The server's VERSION packet: uint32 length 5, byte 2, uint32 version 3.
      if (pending.has(id) && data.length === 9 && data[4] === SSH_FXP_VERSION) {
        pending.delete(id);
        const extension = Buffer.concat([sftpString(POSIX_RENAME), sftpString('1')]);
        const packet = Buffer.concat([Buffer.alloc(4), data.subarray(4), extension]);
        packet.writeUInt32BE(packet.length - 4);
        return send.call(this, id, packet);
      }
      return send.call(this, id, data);
    };
  }
  channels.add(channel);
}

function sftpString(text: string): Buffer {
  const bytes = Buffer.from(text, 'utf8');
  const length = Buffer.alloc(4);
  length.writeUInt32BE(bytes.length);
  return Buffer.concat([length, bytes]);
}

/** The two strings of a posix-rename request: from, to. */
function renamePaths(data: Buffer): [string, string] | undefined {
  const fromLength = data.length >= 4 ? data.readUInt32BE(0) : -1;
  const toAt = 4 + fromLength;
  if (fromLength < 0 || data.length < toAt + 4) return undefined;
  const toLength = data.readUInt32BE(toAt);
  if (data.length < toAt + 4 + toLength) return undefined;
  return [data.toString('utf8', 4, toAt), data.toString('utf8', toAt + 4, toAt + 4 + toLength)];
}

/**
 * Just enough of an SFTP server for an upload: open, write, close, chmod,
 * remove, rename, posix-rename; other requests fail.
 */
function serveSftp(sftp: SFTPWrapper): void {
  const { OK, FAILURE, NO_SUCH_FILE, PERMISSION_DENIED, OP_UNSUPPORTED } = utils.sftp.STATUS_CODE;
  const files = new Map<number, number>();
  let nextHandle = 0;
  const fdOf = (handle: Buffer) => files.get(handle.readUInt32BE(0));
  const run = (reqId: number, operation: () => void) => {
    try {
      operation();
      sftp.status(reqId, OK);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      sftp.status(
        reqId,
        code === 'ENOENT' ? NO_SUCH_FILE : code === 'EACCES' ? PERMISSION_DENIED : FAILURE,
        (error as Error).message,
      );
    }
  };
  sftp.on('OPEN', (reqId, filename, flags, attrs) => {
    try {
      const fd = openSync(filename, utils.sftp.flagsToString(flags) ?? 'r', attrs.mode ?? 0o644);
      const handle = Buffer.alloc(4);
      handle.writeUInt32BE(nextHandle);
      files.set(nextHandle++, fd);
      sftp.handle(reqId, handle);
    } catch (error) {
      sftp.status(reqId, FAILURE, (error as Error).message);
    }
  });
  sftp.on('WRITE', (reqId, handle, offset, data) =>
    run(reqId, () => {
      const fd = fdOf(handle);
      if (fd === undefined) throw new Error('bad handle');
      writeSync(fd, data, 0, data.length, offset);
    }),
  );
  sftp.on('CLOSE', (reqId, handle) =>
    run(reqId, () => {
      const fd = fdOf(handle);
      if (fd === undefined) throw new Error('bad handle');
      files.delete(handle.readUInt32BE(0));
      closeSync(fd);
    }),
  );
  sftp.on('SETSTAT', (reqId, filename, attrs) =>
    run(reqId, () => {
      if (attrs.mode !== undefined) chmodSync(filename, attrs.mode & 0o7777);
    }),
  );
  sftp.on('FSETSTAT', (reqId, handle, attrs) =>
    run(reqId, () => {
      const fd = fdOf(handle);
      if (fd === undefined) throw new Error('bad handle');
      if (attrs.mode !== undefined) fchmodSync(fd, attrs.mode & 0o7777);
    }),
  );
  sftp.on('REMOVE', (reqId, filename) => run(reqId, () => unlinkSync(filename)));
  sftp.on('RENAME', (reqId, from, to) =>
    run(reqId, () => {
      // SFTPv3: renaming onto an existing file fails.
      if (existsSync(to)) throw new Error(`${to} exists`);
      renameSync(from, to);
    }),
  );
  sftp.on('EXTENDED', (reqId, name, data) => {
    const paths = name === POSIX_RENAME && data ? renamePaths(data) : undefined;
    if (!paths) return sftp.status(reqId, OP_UNSUPPORTED);
    run(reqId, () => renameSync(...paths));
  });
  for (const request of [
    'READ',
    'OPENDIR',
    'READDIR',
    'LSTAT',
    'FSTAT',
    'STAT',
    'RMDIR',
    'MKDIR',
    'READLINK',
    'SYMLINK',
    'REALPATH',
  ] as const) {
    sftp.on(request, (reqId: number) => sftp.status(reqId, OP_UNSUPPORTED));
  }
  sftp.on('close', () => {
    for (const fd of files.values()) closeSync(fd);
    files.clear();
  });
}
