import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { LabProcessError } from './errors.js';

/**
 * A `shepherd` process of the lab: its output appended to a log file of the
 * lab's directory and kept (the end of it) for messages; stopped with
 * SIGTERM, then SIGKILL if it does not end.
 *
 * It runs in a process group of its own, as the embedded PostgreSQL does, so
 * a terminal's Ctrl-C (sent to the whole foreground group) reaches only the
 * lab, which stops it once, in order. Reached by the terminal's signal and
 * then by the lab's, a shepherd process took the second for "exit at once",
 * and its PostgreSQL was still shutting down when the lab removed its
 * directory.
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
        process.off('exit', this.#onExit);
        resolve({ code, signal });
      }),
    );
    // Out of the terminal's reach, it would outlive a lab that exits without stop() (an uncaught error).
    process.once('exit', this.#onExit);
  }

  readonly #onExit = () => {
    if (this.running) this.child.kill('SIGTERM');
  };

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
      detached: true,
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

  /**
   * SIGTERM, then SIGKILL after `grace` ms.
   *
   * @throws {@link LabProcessError} naming it and its log when it did not stop cleanly (exit 0)
   */
  async stop(grace = 15_000): Promise<void> {
    if (this.running) {
      this.child.kill('SIGTERM');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), grace);
      await this.exited;
      clearTimeout(timer);
    }
    const { code, signal } = await this.exited;
    if (code !== 0) {
      throw new LabProcessError(
        this.name,
        `did not stop cleanly (${signal ?? `exit ${code}`}); its log: ${this.logFile}`,
      );
    }
  }
}
