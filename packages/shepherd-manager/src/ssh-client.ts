import { randomBytes } from 'node:crypto';
import { isIPv6 } from 'node:net';
import createDebug from 'debug';
import { type ClientChannel, type SFTPWrapper, Client as Ssh2Connector } from 'ssh2';
import type { HostKeyPinStore } from './host-key-pins.js';
import { ShepherdError } from './provider.js';
import { sshFingerprint } from './ssh-key.js';

const log = createDebug('shepherd:ssh');
/** Each connection's steps (dialing, connected, closed); the CLI's default logs leave them out. */
const detail = createDebug('shepherd:ssh:detail');

/** Default cap on each of a command's stdout and stderr: agents answer in bytes, not megabytes. */
export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;

/** The machine to connect to. */
export interface SshTarget {
  /** IP address (v4 or v6 literal) or host name. */
  readonly host: string;
  readonly port: number;
  /** The machine's BMDB ID: named in errors and logs, and the key of its host key pin. */
  readonly machineId?: string | undefined;
}

/** Options of {@link SshClient.dial}. */
export interface SshDialOptions {
  /** Milliseconds for TCP connect, SSH handshake and authentication together. */
  readonly connectTimeout: number;
  readonly signal?: AbortSignal | undefined;
}

/** The outcome of a command that ran to its end. */
export interface SshExecResult {
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;
  /** Exit status; `null` when the command was killed by a signal. */
  readonly exitCode: number | null;
  /** Name of the signal that killed the command (`KILL`, `SEGV`, …), else `null`. */
  readonly exitSignal: string | null;
}

/** Opens SSH connections. The shepherd uses {@link Ssh2Client}; tests inject fakes. */
export interface SshClient {
  /** Connects and authenticates to `target`. */
  dial(target: SshTarget, options: SshDialOptions): Promise<SshConnection>;
}

/** An authenticated SSH connection to one machine. */
export interface SshConnection {
  readonly target: SshTarget;
  /**
   * Runs `command`, writing `stdin` to its standard input, and resolves once it
   * exited, whatever its exit status. Output beyond the client's limit fails
   * the call. Aborting `signal` closes the command's channel (asking the
   * server to kill the command) and rejects with {@link SshAbortedError}.
   */
  execute(command: string, stdin: Uint8Array, signal?: AbortSignal): Promise<SshExecResult>;
  /**
   * Puts `data` at `targetPath` as a file of mode 0755, replacing any file
   * there (by rename, so even an executable that is still running).
   */
  upload(targetPath: string, data: Uint8Array, signal?: AbortSignal): Promise<void>;
  /** Ends the connection; idempotent. */
  close(): Promise<void>;
}

/** Options of {@link Ssh2Client}. */
export interface Ssh2ClientOptions {
  /** The private key to authenticate with, in OpenSSH format: {@link SshKey.privateKey}. */
  readonly privateKey: string | Buffer;
  /** Default: `root`. */
  readonly username?: string;
  /**
   * How host keys are checked. `accept-any` (the default, as in the original
   * shepherd: a fresh machine's key cannot be known in advance) trusts every
   * key. A {@link HostKeyPinStore} pins the first key a machine authenticated
   * with and refuses a different one with {@link HostKeyMismatchError}.
   */
  readonly hostKeys?: 'accept-any' | HostKeyPinStore;
  /** Cap on each of stdout and stderr of `execute`. Default {@link DEFAULT_MAX_OUTPUT_BYTES}. */
  readonly maxOutputBytes?: number;
}

/** Base class of SSH failures; names the target in its message. */
export class SshError extends ShepherdError {
  override name = 'SshError';
  readonly host: string;
  readonly port: number;
  readonly machineId: string | undefined;
  constructor(target: SshTarget, problem: string, options?: ErrorOptions) {
    super(`SSH to ${describeTarget(target)}: ${problem}`, options);
    this.host = target.host;
    this.port = target.port;
    this.machineId = target.machineId;
  }
}

/** Connecting, the handshake or authentication failed. */
export class SshDialError extends SshError {
  override name = 'SshDialError';
  constructor(
    target: SshTarget,
    problem: string,
    /** The connect timeout passed before the connection was ready. */
    readonly timedOut: boolean,
    options?: ErrorOptions,
  ) {
    super(target, problem, options);
  }
}

/** The machine presented a host key other than the one pinned for it. */
export class HostKeyMismatchError extends SshError {
  override name = 'HostKeyMismatchError';
  constructor(
    target: SshTarget,
    /** The key the pin store holds for the machine. */
    readonly pinnedFingerprint: string,
    /** The key the machine presented. */
    readonly presentedFingerprint: string,
  ) {
    super(
      target,
      `host key ${presentedFingerprint} differs from the pinned ${pinnedFingerprint}; ` +
        `refusing to connect (unpin ${pinKey(target)} if the machine was reinstalled)`,
    );
  }
}

/** A command could not be run to its end. */
export class SshExecError extends SshError {
  override name = 'SshExecError';
  constructor(
    target: SshTarget,
    readonly command: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(target, `${JSON.stringify(command)}: ${problem}`, options);
  }
}

/** A command wrote more output than the client accepts; it was killed. */
export class SshOutputLimitError extends SshExecError {
  override name = 'SshOutputLimitError';
  constructor(
    target: SshTarget,
    command: string,
    readonly stream: 'stdout' | 'stderr',
    readonly limit: number,
  ) {
    super(target, command, `wrote more than ${limit} bytes to ${stream}; killed`);
  }
}

/** Writing a file over SFTP failed. */
export class SshUploadError extends SshError {
  override name = 'SshUploadError';
  constructor(
    target: SshTarget,
    readonly targetPath: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(target, `upload to ${targetPath}: ${problem}`, options);
  }
}

/** An operation was stopped by its abort signal; `cause` is the signal's reason. */
export class SshAbortedError extends SshError {
  override name = 'SshAbortedError';
  constructor(
    target: SshTarget,
    readonly operation: string,
    reason: unknown,
  ) {
    super(target, `${operation} aborted: ${messageOf(reason)}`, { cause: reason });
  }
}

/** An {@link SshClient} over the `ssh2` library: SFTP for uploads, exec channels for commands. */
export class Ssh2Client implements SshClient {
  readonly #privateKey: string | Buffer;
  readonly #username: string;
  readonly #hostKeys: 'accept-any' | HostKeyPinStore;
  readonly #maxOutputBytes: number;

  constructor(options: Ssh2ClientOptions) {
    this.#privateKey = options.privateKey;
    this.#username = options.username ?? 'root';
    this.#hostKeys = options.hostKeys ?? 'accept-any';
    this.#maxOutputBytes = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  }

  async dial(target: SshTarget, options: SshDialOptions): Promise<SshConnection> {
    const { connectTimeout, signal } = options;
    if (signal?.aborted) throw new SshAbortedError(target, 'dial', signal.reason);
    const pins = this.#hostKeys === 'accept-any' ? undefined : this.#hostKeys;
    const started = performance.now();
    const connector = new Ssh2Connector();
    // Set by the host key check, which ssh2 can only answer yes or no.
    let presented: string | undefined;
    let refusal: SshError | undefined;

    const ready = new Promise<void>((resolve, reject) => {
      connector.once('ready', resolve);
      connector.on('error', (error: Error & { level?: string }) => {
        log('%s: %s', describeTarget(target), error.message);
        const timedOut = error.level === 'client-timeout';
        reject(
          refusal ??
            new SshDialError(
              target,
              timedOut ? `not ready within the connect timeout of ${connectTimeout} ms` : error.message,
              timedOut,
              { cause: error },
            ),
        );
      });
      connector.once('close', () =>
        reject(refusal ?? new SshDialError(target, 'connection closed before it was ready', false)),
      );
    });

    // SSH here is request and answer (every SFTP write waits for its status): Nagle's
    // algorithm would hold each request back for the peer's delayed ACK, ~40 ms a round trip.
    connector.once('connect', () => connector.setNoDelay(true));
    detail('%s: dialing (timeout %d ms)', describeTarget(target), connectTimeout);
    connector.connect({
      host: target.host,
      port: target.port,
      username: this.#username,
      privateKey: this.#privateKey,
      readyTimeout: connectTimeout,
      hostVerifier: (key: Buffer, verify: (valid: boolean) => void): void => {
        const fingerprint = sshFingerprint(key);
        presented = fingerprint;
        if (!pins) {
          verify(true);
          return;
        }
        // Only checked here; pinned once the machine proved it holds our authorized key.
        pins.get(pinKey(target)).then(
          (pinned) => {
            if (pinned !== undefined && pinned !== fingerprint) {
              refusal = new HostKeyMismatchError(target, pinned, fingerprint);
            }
            verify(refusal === undefined);
          },
          (error: unknown) => {
            refusal = new SshDialError(target, `host key pin store failed: ${messageOf(error)}`, false, {
              cause: error,
            });
            verify(false);
          },
        );
      },
    });

    try {
      await abortable(ready, signal, () => connector.destroy(), target, 'dial');
      if (pins && presented !== undefined) await this.#pin(pins, target, presented);
    } catch (error) {
      connector.destroy();
      throw error;
    }
    detail(
      '%s: connected in %d ms, host key %s',
      describeTarget(target),
      Math.round(performance.now() - started),
      presented,
    );
    return new Ssh2Connection(connector, target, this.#maxOutputBytes);
  }

  async #pin(pins: HostKeyPinStore, target: SshTarget, fingerprint: string): Promise<void> {
    let pinned: string;
    try {
      pinned = await pins.pin(pinKey(target), fingerprint);
    } catch (error) {
      throw new SshDialError(target, `host key pin store failed: ${messageOf(error)}`, false, { cause: error });
    }
    // Another connection to the same machine pinned a different key meanwhile.
    if (pinned !== fingerprint) throw new HostKeyMismatchError(target, pinned, fingerprint);
  }
}

class Ssh2Connection implements SshConnection {
  #closed = false;

  constructor(
    private readonly connector: Ssh2Connector,
    readonly target: SshTarget,
    private readonly maxOutputBytes: number,
  ) {
    connector.once('close', () => {
      this.#closed = true;
      detail('%s: connection closed', describeTarget(target));
    });
  }

  async execute(command: string, stdin: Uint8Array, signal?: AbortSignal): Promise<SshExecResult> {
    const { target } = this;
    const operation = `execute ${JSON.stringify(command)}`;
    if (signal?.aborted) throw new SshAbortedError(target, operation, signal.reason);
    let channel: ClientChannel | undefined;
    let aborted = false;

    const finished = new Promise<SshExecResult>((resolve, reject) => {
      const startFailed = (error: unknown) =>
        reject(new SshExecError(target, command, `cannot start: ${messageOf(error)}`, { cause: error }));
      // Throws when the connection is gone; the callback reports other failures.
      tryOrElse(startFailed, () =>
        this.connector.exec(command, (error, opened) => {
          if (error) return startFailed(error);
          channel = opened;
          // Listen in this very callback: a quick command's exit status can arrive in
          // the same packet as the channel's opening and is emitted before any await resumes.
          resolve(runCommand(opened, stdin, target, command, this.maxOutputBytes, () => this.#closed));
          if (aborted) killChannel(opened);
        }),
      );
    });

    return abortable(
      finished,
      signal,
      () => {
        aborted = true;
        if (channel) killChannel(channel);
      },
      target,
      operation,
    );
  }

  async upload(targetPath: string, data: Uint8Array, signal?: AbortSignal): Promise<void> {
    const { target } = this;
    if (signal?.aborted) throw new SshAbortedError(target, `upload to ${targetPath}`, signal.reason);
    const started = performance.now();
    let sftp: SFTPWrapper | undefined;
    let aborted = false;

    const written = (async () => {
      const session = await new Promise<SFTPWrapper>((resolve, reject) => {
        const startFailed = (error: unknown) =>
          reject(new SshUploadError(target, targetPath, `cannot start SFTP: ${messageOf(error)}`, { cause: error }));
        tryOrElse(startFailed, () =>
          this.connector.sftp((error, opened) => (error ? startFailed(error) : resolve(opened))),
        );
      });
      if (aborted) {
        session.end();
        return;
      }
      sftp = session;
      try {
        await replaceFile(session, target, targetPath, Buffer.from(data.buffer, data.byteOffset, data.byteLength));
      } finally {
        session.end();
      }
      log(
        '%s: uploaded %d bytes to %s in %d ms',
        describeTarget(target),
        data.byteLength,
        targetPath,
        Math.round(performance.now() - started),
      );
    })();

    // ssh2 leaves SFTP requests pending when the connection drops: without this, a
    // connection cut mid-upload would hang the upload until its signal (the exec timeout).
    const lost = this.#whenLost(
      () => new SshUploadError(target, targetPath, 'the connection was lost before the upload completed'),
    );
    try {
      return await abortable(
        Promise.race([written, lost.promise]),
        signal,
        () => {
          aborted = true;
          sftp?.end();
        },
        target,
        `upload to ${targetPath}`,
      );
    } finally {
      lost.dispose();
    }
  }

  /** A promise that rejects with `error()` once the connection closes (at once if it has). */
  #whenLost(error: () => Error): { promise: Promise<never>; dispose: () => void } {
    let onClose: (() => void) | undefined;
    const promise = new Promise<never>((_, reject) => {
      onClose = () => reject(error());
      if (this.#closed) onClose();
      else this.connector.once('close', onClose);
    });
    promise.catch(() => {});
    return {
      promise,
      dispose: () => {
        if (onClose) this.connector.off('close', onClose);
      },
    };
  }

  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.connector.once('close', () => resolve());
      this.connector.end();
      // A peer that does not answer the disconnect must not hold us up.
      setTimeout(() => this.connector.destroy(), 1000).unref();
    });
  }
}

/** Feeds `stdin` to a started command and collects its output and exit status. */
function runCommand(
  channel: ClientChannel,
  stdin: Uint8Array,
  target: SshTarget,
  command: string,
  maxOutputBytes: number,
  connectionLost: () => boolean,
): Promise<SshExecResult> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const stdout = new BoundedOutput(maxOutputBytes);
    const stderr = new BoundedOutput(maxOutputBytes);
    let exitCode: number | null = null;
    let exitSignal: string | null = null;
    const collect = (output: BoundedOutput, stream: 'stdout' | 'stderr') => (chunk: Buffer) => {
      if (output.append(chunk)) return;
      reject(new SshOutputLimitError(target, command, stream, maxOutputBytes));
      killChannel(channel);
    };
    channel.on('data', collect(stdout, 'stdout'));
    channel.stderr.on('data', collect(stderr, 'stderr'));
    channel.on('exit', (code: number | null, signalName?: string) => {
      exitCode = code;
      exitSignal = signalName ?? null;
    });
    channel.on('error', (error: Error) => reject(new SshExecError(target, command, error.message, { cause: error })));
    channel.on('close', () => {
      if (exitCode === null && exitSignal === null) {
        const why = connectionLost() ? 'the connection was lost' : 'the channel closed';
        reject(new SshExecError(target, command, `${why} before the command reported an exit status`));
        return;
      }
      log(
        '%s: %s exited with %s after %d ms (%d bytes stdout, %d bytes stderr)',
        describeTarget(target),
        JSON.stringify(command),
        exitSignal ? `signal ${exitSignal}` : `status ${exitCode}`,
        Math.round(performance.now() - started),
        stdout.length,
        stderr.length,
      );
      resolve({ stdout: stdout.bytes(), stderr: stderr.bytes(), exitCode, exitSignal });
    });
    channel.end(Buffer.from(stdin.buffer, stdin.byteOffset, stdin.byteLength));
  });
}

const killedChannels = new WeakSet<ClientChannel>();

/** Ends a command: closing the channel alone would leave it running, so first ask for a signal. */
function killChannel(channel: ClientChannel): void {
  if (killedChannels.has(channel)) return;
  killedChannels.add(channel);
  sendKillSignal(channel);
  channel.close();
}

/**
 * Writes `contents` next to `targetPath`, makes it mode 0755 and renames it
 * over `targetPath`. Renaming, not rewriting in place, so that a copy of the
 * agent still running from an earlier attempt is no obstacle (Linux refuses to
 * open a running executable for writing: ETXTBSY), and so that the target is
 * never a half-written executable.
 */
async function replaceFile(sftp: SFTPWrapper, target: SshTarget, targetPath: string, contents: Buffer): Promise<void> {
  const temporary = `${targetPath}.upload-${randomBytes(4).toString('hex')}`;
  const step = (problem: string, run: (done: (error?: Error | null) => void) => void): Promise<void> =>
    new Promise((resolve, reject) =>
      run((error) =>
        error
          ? reject(new SshUploadError(target, targetPath, `${problem}: ${error.message}`, { cause: error }))
          : resolve(),
      ),
    );
  try {
    await step(`cannot write ${temporary}`, (done) => sftp.writeFile(temporary, contents, { mode: 0o755 }, done));
    // The mode given at creation is subject to the server's umask.
    await step('cannot chmod 0755', (done) => sftp.chmod(temporary, 0o755, done));
    await step('cannot rename into place', (done) => {
      try {
        sftp.ext_openssh_rename(temporary, targetPath, done);
      } catch {
        // No posix-rename@openssh.com: plain SFTP rename refuses to replace a file, so remove it first.
        sftp.unlink(targetPath, () => sftp.rename(temporary, targetPath, done));
      }
    });
  } catch (error) {
    sftp.unlink(temporary, () => {});
    throw error;
  }
}

/**
 * Asks the server to SIGKILL the command's process group. OpenSSH (≥ 7.9)
 * does so for users other than root only: root sessions run without privilege
 * separation, which it requires for signals. ssh2's `Channel.signal()`
 * refuses once our side sent EOF, as it did with every command's stdin,
 * though the protocol allows the request then; so the request goes to ssh2's
 * protocol layer, if that still looks as expected.
 */
function sendKillSignal(channel: ClientChannel): void {
  const internals = channel as unknown as {
    _client?: { _protocol?: { signal?: unknown } };
    outgoing?: { id?: unknown; state?: unknown };
  };
  const protocol = internals._client?._protocol;
  const id = internals.outgoing?.id;
  const state = internals.outgoing?.state;
  if (typeof protocol?.signal !== 'function' || typeof id !== 'number' || (state !== 'open' && state !== 'eof')) {
    log('cannot send a KILL signal request: unexpected ssh2 channel internals');
    return;
  }
  try {
    protocol.signal(id, 'KILL');
  } catch (error) {
    log('cannot send a KILL signal request: %s', messageOf(error));
  }
}

/** Collects a stream's chunks up to a byte limit. */
class BoundedOutput {
  readonly #chunks: Buffer[] = [];
  length = 0;

  constructor(readonly limit: number) {}

  /** Appends `chunk`; false (and nothing appended) when that would pass the limit. */
  append(chunk: Buffer): boolean {
    if (this.length + chunk.length > this.limit) return false;
    this.#chunks.push(chunk);
    this.length += chunk.length;
    return true;
  }

  bytes(): Uint8Array {
    return new Uint8Array(Buffer.concat(this.#chunks, this.length));
  }
}

/** Settles with `work`, or rejects with {@link SshAbortedError} (after `onAbort`) when `signal` fires first. */
async function abortable<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
  onAbort: () => void,
  target: SshTarget,
  operation: string,
): Promise<T> {
  if (!signal) return work;
  let listener: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    listener = () => {
      log('%s: %s aborted', describeTarget(target), operation);
      onAbort();
      reject(new SshAbortedError(target, operation, signal.reason));
    };
    if (signal.aborted) listener();
    else signal.addEventListener('abort', listener, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    if (listener) signal.removeEventListener('abort', listener);
  }
}

function tryOrElse(onError: (error: unknown) => void, run: () => void): void {
  try {
    run();
  } catch (error) {
    onError(error);
  }
}

function hostPort({ host, port }: SshTarget): string {
  return isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`;
}

/** Key of a target's host key pin: its machine ID, else where it listens. */
function pinKey(target: SshTarget): string {
  return target.machineId ?? hostPort(target);
}

function describeTarget(target: SshTarget): string {
  return target.machineId ? `machine ${target.machineId} at ${hostPort(target)}` : hostPort(target);
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
