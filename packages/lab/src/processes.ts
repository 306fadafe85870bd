import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';

/**
 * A `shepherd` process of the lab: its output appended to a log file of the
 * lab's directory and kept (the end of it) for messages; stopped with
 * SIGTERM, then SIGKILL if it does not end.
 */
export class LabProcess {
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  #tail = '';

  private constructor(
    readonly name: string,
    readonly child: ChildProcess,
    readonly logFile: string,
  ) {
    const log = createWriteStream(logFile, { flags: 'a' });
    const keep = (chunk: Buffer) => {
      log.write(chunk);
      this.#tail = (this.#tail + chunk.toString('utf8')).slice(-20_000);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    this.exited = new Promise((resolve) =>
      child.once('close', (code, signal) => {
        log.end();
        resolve({ code, signal });
      }),
    );
  }

  /** Starts `node <script> <args>` with `env` over a clean environment (no inherited SHEPHERD_*). */
  static start(
    name: string,
    script: string,
    args: readonly string[],
    logFile: string,
    env: Record<string, string> = {},
  ): LabProcess {
    const inherited = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('SHEPHERD_')));
    const child = spawn(process.execPath, [script, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...inherited, ...env },
    });
    return new LabProcess(name, child, logFile);
  }

  /** The end of what it printed. */
  get output(): string {
    return this.#tail;
  }

  get running(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Resolves once its output matches `pattern`; rejects if it exits first or `timeout` passes. */
  async printed(pattern: RegExp, timeout = 60_000, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + timeout;
    while (!pattern.test(this.#tail)) {
      signal?.throwIfAborted();
      if (!this.running) throw new Error(`${this.name} exited before printing ${pattern}:\n${this.#tail.slice(-3000)}`);
      if (Date.now() > deadline)
        throw new Error(`${this.name} did not print ${pattern} within ${timeout} ms:\n${this.#tail.slice(-3000)}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /** SIGTERM, then SIGKILL after `grace` ms. */
  async stop(grace = 15_000): Promise<void> {
    if (!this.running) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), grace);
    await this.exited;
    clearTimeout(timer);
  }
}
