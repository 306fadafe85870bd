import { spawn } from 'node:child_process';
import { IpmitoolMissingError } from '../errors.js';
import type { IpmiClientSettings } from './client-settings.js';
import { IPMI_DEFAULT_CIPHER_SUITE, IPMI_DEFAULT_PORT, type IpmiTarget } from './target.js';

/** What one ipmitool run left behind. */
export interface IpmitoolOutput {
  /** Exit code; `null` when it was killed. */
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Killed after the client's timeout. */
  readonly timedOut: boolean;
}

/** Most of ipmitool's output kept per stream: its answers are a few lines. */
const MAX_OUTPUT = 64 * 1024;

/**
 * Runs `ipmitool -I lanplus … <command>` once against `target`.
 *
 * The password reaches the child through `-E`, i.e. `IPMI_PASSWORD` in the
 * child's environment alone: that environment is readable only by the
 * child's user and root (`/proc/<pid>/environ` is 0400), the same as the
 * shepherd's own memory that holds the password anyway, while a command line
 * is readable by everyone (`ps`). A 0600 file handed to `-f` would be as
 * private but is a file on disk that a shepherd killed mid-command leaves
 * behind. The child gets no other variable of ours (no API key of another
 * provider), and `LC_ALL=C` so that its messages can be read.
 *
 * The child is killed (SIGKILL) after `settings.timeout`, and when `signal`
 * aborts (then this rejects with the signal's reason).
 *
 * @throws {@link IpmitoolMissingError} when the program cannot be found
 */
export function runIpmitool(
  settings: Pick<IpmiClientSettings, 'ipmitool' | 'timeout' | 'messageTimeout' | 'messageRetries'>,
  target: IpmiTarget,
  command: readonly string[],
  signal: AbortSignal | undefined,
): Promise<IpmitoolOutput> {
  signal?.throwIfAborted();
  const args = [
    '-I',
    'lanplus',
    '-H',
    target.host,
    '-p',
    String(target.port ?? IPMI_DEFAULT_PORT),
    '-U',
    target.username,
    '-E',
    '-C',
    String(target.cipherSuite ?? IPMI_DEFAULT_CIPHER_SUITE),
    // Verbose: without it a refused password and a silent BMC both read "Unable to establish … session".
    '-v',
    ...(settings.messageTimeout === undefined ? [] : ['-N', String(settings.messageTimeout)]),
    ...(settings.messageRetries === undefined ? [] : ['-R', String(settings.messageRetries)]),
    ...command,
  ];
  return new Promise((resolve, reject) => {
    const child = spawn(settings.ipmitool, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
        LC_ALL: 'C',
        IPMI_PASSWORD: target.password.reveal(),
      },
    });
    const stdout = collect(child.stdout);
    const stderr = collect(child.stderr);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, settings.timeout);
    const onAbort = () => child.kill('SIGKILL');
    signal?.addEventListener('abort', onAbort, { once: true });
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    child.once('error', (error: NodeJS.ErrnoException) => {
      done();
      if (error.code === 'ENOENT' || error.code === 'EACCES') reject(new IpmitoolMissingError(settings.ipmitool));
      else reject(error);
    });
    child.once('close', (code) => {
      done();
      if (signal?.aborted) reject(signal.reason);
      else resolve({ code, stdout: stdout(), stderr: stderr(), timedOut });
    });
  });
}

function collect(stream: NodeJS.ReadableStream): () => string {
  const chunks: Buffer[] = [];
  let size = 0;
  stream.on('data', (chunk: Buffer) => {
    if (size >= MAX_OUTPUT) return;
    chunks.push(chunk.subarray(0, MAX_OUTPUT - size));
    size += chunk.length;
  });
  return () => Buffer.concat(chunks).toString('utf8');
}
