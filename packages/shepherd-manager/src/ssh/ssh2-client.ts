/** Dialing over ssh2, with the host key checked against its pin. */
import { describeError } from '@bmaas/common';
import { Client as Ssh2Connector } from 'ssh2';
import type { HostKeyPinStore } from '../host-key-pins.js';
import type { SshClient, SshConnection, SshDialOptions, SshTarget } from '../ssh-client.js';
import { sshFingerprint } from '../ssh-key.js';
import { abortable } from './abortable.js';
import { HostKeyMismatchError, SshAbortedError, SshDialError, type SshError } from './errors.js';
import { detail, log } from './log.js';
import { Ssh2Connection } from './ssh2-connection.js';
import { describeTarget, pinKey } from './target.js';

/** Default cap on each of a command's stdout and stderr: agents answer in bytes, not megabytes. */
export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;

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
            refusal = new SshDialError(target, `host key pin store failed: ${describeError(error)}`, false, {
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
      throw new SshDialError(target, `host key pin store failed: ${describeError(error)}`, false, { cause: error });
    }
    // Another connection to the same machine pinned a different key meanwhile.
    if (pinned !== fingerprint) throw new HostKeyMismatchError(target, pinned, fingerprint);
  }
}
