/** The SSH failures, each naming its target; callers test them with `instanceof`. */
import { describeError } from '@bmaas/common';
import { ShepherdError } from '../provider.js';
import type { SshTarget } from '../ssh-client.js';
import { describeTarget, pinKey } from './target.js';

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
    super(target, `${operation} aborted: ${describeError(reason)}`, { cause: reason });
  }
}
