/** An open ssh2 connection to one machine: commands and uploads. */
import { describeError } from '@bmaas/common';
import type { ClientChannel, SFTPWrapper, Client as Ssh2Connector } from 'ssh2';
import type { SshConnection, SshExecResult, SshTarget } from '../ssh-client.js';
import { abortable, tryOrElse } from './abortable.js';
import { SshAbortedError, SshExecError, SshUploadError } from './errors.js';
import { killChannel, runCommand } from './exec.js';
import { detail, log } from './log.js';
import { replaceFile } from './sftp.js';
import { describeTarget } from './target.js';

/** An {@link SshConnection} over an ssh2 client that is ready. */
export class Ssh2Connection implements SshConnection {
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
        reject(new SshExecError(target, command, `cannot start: ${describeError(error)}`, { cause: error }));
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
          reject(
            new SshUploadError(target, targetPath, `cannot start SFTP: ${describeError(error)}`, { cause: error }),
          );
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
