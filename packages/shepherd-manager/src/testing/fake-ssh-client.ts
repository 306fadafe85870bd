import { generateKeyPairSync } from 'node:crypto';
import { type TakeoverInit, TakeoverInitSchema, TakeoverResponseSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import { create, fromBinary, toBinary } from '@bufbuild/protobuf';
import { SshAbortedError, SshDialError } from '../ssh/errors.js';
import type { SshClient, SshConnection, SshDialOptions, SshExecResult, SshTarget } from '../ssh-client.js';

/** A command run through a {@link FakeSshClient}. */
export interface FakeExecution {
  readonly target: SshTarget;
  readonly command: string;
  readonly stdin: Uint8Array;
}

/** A file written through a {@link FakeSshClient}. */
export interface FakeUpload {
  readonly target: SshTarget;
  readonly path: string;
  readonly data: Uint8Array;
}

/**
 * Behaviour to inject per call. A hook that throws fails the call; one that
 * never settles hangs it until its signal (or, for `dial`, the connect
 * timeout) ends it, as a real unresponsive machine would.
 */
export interface FakeSshHooks {
  dial?(target: SshTarget): void | Promise<void>;
  /** Returns the command's outcome, or `undefined` for the fake agent's answer. */
  execute?(execution: FakeExecution): SshExecResult | undefined | Promise<SshExecResult | undefined>;
  upload?(upload: FakeUpload): void | Promise<void>;
}

/**
 * An {@link SshClient} that connects nowhere: every command answers like a
 * well-behaved agent (a `TakeoverSuccess` echoing the `TakeoverInit` read
 * from stdin, with a fresh ed25519 key), and uploads are only recorded.
 */
export class FakeSshClient implements SshClient {
  readonly dials: SshTarget[] = [];
  readonly executions: FakeExecution[] = [];
  readonly uploads: FakeUpload[] = [];
  #open = 0;

  constructor(readonly hooks: FakeSshHooks = {}) {}

  /** Connections dialed and not closed yet. */
  get openConnections(): number {
    return this.#open;
  }

  async dial(target: SshTarget, options: SshDialOptions): Promise<SshConnection> {
    this.dials.push(target);
    const { connectTimeout, signal } = options;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new SshDialError(target, `not ready within the connect timeout of ${connectTimeout} ms`, true)),
        connectTimeout,
      );
    });
    try {
      await Promise.race([hooked(this.hooks.dial?.(target), signal, target, 'dial'), timeout]);
    } finally {
      clearTimeout(timer);
    }
    this.#open++;
    let closed = false;
    return {
      target,
      execute: async (command, stdin, execSignal) => {
        const execution = { target, command, stdin };
        this.executions.push(execution);
        const result = await hooked(this.hooks.execute?.(execution), execSignal, target, `execute ${command}`);
        return result ?? answerLikeAnAgent(stdin);
      },
      upload: async (path, data, uploadSignal) => {
        const upload = { target, path, data };
        this.uploads.push(upload);
        await hooked(this.hooks.upload?.(upload), uploadSignal, target, `upload to ${path}`);
      },
      close: async () => {
        if (!closed) this.#open--;
        closed = true;
      },
    };
  }
}

function answerLikeAnAgent(stdin: Uint8Array): SshExecResult {
  let init: TakeoverInit;
  try {
    init = fromBinary(TakeoverInitSchema, stdin);
  } catch (error) {
    const message = `while unmarshaling TakeoverInit message: ${error instanceof Error ? error.message : error}\n`;
    return { stdout: new Uint8Array(), stderr: new TextEncoder().encode(message), exitCode: 1, exitSignal: null };
  }
  const jwk = generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' });
  const response = create(TakeoverResponseSchema, {
    result: { case: 'success', value: { initMessage: init, key: Buffer.from(jwk.x ?? '', 'base64url') } },
  });
  return {
    stdout: toBinary(TakeoverResponseSchema, response),
    stderr: new Uint8Array(),
    exitCode: 0,
    exitSignal: null,
  };
}

/** Awaits a hook's result, unless `signal` aborts first. */
async function hooked<T>(
  result: T | Promise<T>,
  signal: AbortSignal | undefined,
  target: SshTarget,
  operation: string,
): Promise<T> {
  if (!signal) return result;
  if (signal.aborted) throw new SshAbortedError(target, operation, signal.reason);
  let listener: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    listener = () => reject(new SshAbortedError(target, operation, signal.reason));
    signal.addEventListener('abort', listener, { once: true });
  });
  try {
    return await Promise.race([result, aborted]);
  } finally {
    if (listener) signal.removeEventListener('abort', listener);
  }
}
