/**
 * The SSH port the initializer drives: what it dials and what a connection
 * can do. `Ssh2Client` (`ssh/ssh2-client.ts`) implements it over ssh2,
 * `FakeSshClient` (`testing/`) in tests; their parts are in `ssh/`.
 */

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

/** Opens SSH connections. The shepherd uses `Ssh2Client`; tests inject fakes. */
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
   * server to kill the command) and rejects with `SshAbortedError`.
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
