/** Running one command on an exec channel: stdin in, bounded output and exit status out. */
import type { ClientChannel } from 'ssh2';
import type { SshExecResult, SshTarget } from '../ssh-client.js';
import { SshExecError, SshOutputLimitError } from './errors.js';
import { log } from './log.js';
import { sendKillSignal } from './ssh2-internals.js';
import { describeTarget } from './target.js';

export /** Feeds `stdin` to a started command and collects its output and exit status. */
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
export function killChannel(channel: ClientChannel): void {
  if (killedChannels.has(channel)) return;
  killedChannels.add(channel);
  sendKillSignal(channel);
  channel.close();
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
