import { connect, type Socket } from 'node:net';

/** A QMP command QEMU refused (`{"error": {"class", "desc"}}`). */
export class QmpCommandError extends Error {
  override name = 'QmpCommandError';
  constructor(
    readonly command: string,
    /** QMP's error class, `GenericError`, `CommandNotFound`, … */
    readonly errorClass: string,
    readonly description: string,
  ) {
    super(`QMP ${command}: ${errorClass}: ${description}`);
  }
}

/** `query-status`'s answer. */
export interface QmpStatus {
  readonly running: boolean;
  /** `running`, `paused`, `shutdown`, `prelaunch`, `internal-error`, … */
  readonly status: string;
}

type Pending = { resolve: (value: unknown) => void; reject: (error: Error) => void; command: string };

/**
 * A client of QEMU's machine protocol (QMP) over its Unix socket: JSON lines,
 * a greeting, `qmp_capabilities`, then commands answered in order (by `id`).
 * QEMU serves one client per socket at a time, so connections are short:
 * {@link QmpClient.with} opens, runs and closes.
 *
 * @example
 * ```ts
 * const status = await QmpClient.with('/tmp/vm/qmp.sock', (qmp) => qmp.execute<QmpStatus>('query-status'));
 * ```
 */
export class QmpClient {
  readonly #socket: Socket;
  readonly #pending = new Map<number, Pending>();
  #nextId = 1;
  #buffer = '';
  #closed: Error | undefined;
  /** Events QEMU sent (`SHUTDOWN`, `RESET`, `STOP`, …), oldest first. */
  readonly events: Array<{ event: string; data?: unknown }> = [];
  readonly #listeners: Array<(event: { event: string; data?: unknown }) => void> = [];

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.setEncoding('utf8');
  }

  /** Connects, reads the greeting and leaves capabilities negotiation mode. */
  static async connect(socketPath: string, options: { timeout?: number } = {}): Promise<QmpClient> {
    const timeout = options.timeout ?? 10_000;
    const socket = connect(socketPath);
    const client = new QmpClient(socket);
    const timer = setTimeout(
      () => socket.destroy(new Error(`no QMP greeting on ${socketPath} within ${timeout} ms`)),
      timeout,
    );
    try {
      await new Promise<void>((resolve, reject) => {
        const onData = (chunk: string) => {
          client.#buffer += chunk;
          const newline = client.#buffer.indexOf('\n');
          if (newline < 0) return;
          const greeting = client.#buffer.slice(0, newline);
          client.#buffer = client.#buffer.slice(newline + 1);
          socket.off('data', onData);
          socket.off('error', reject);
          if (!greeting.includes('"QMP"'))
            reject(new Error(`${socketPath} is not a QMP socket (greeting ${greeting.slice(0, 100)})`));
          else resolve();
        };
        socket.on('data', onData);
        socket.once('error', reject);
      });
    } finally {
      clearTimeout(timer);
    }
    socket.on('data', (chunk: string) => client.#receive(chunk));
    socket.on('error', (error) => client.#fail(error));
    socket.on('close', () => client.#fail(new Error(`QMP connection to ${socketPath} closed`)));
    await client.execute('qmp_capabilities');
    return client;
  }

  /** Opens a connection, runs `use` on it, and closes it whatever happens. */
  static async with<T>(socketPath: string, use: (qmp: QmpClient) => Promise<T>): Promise<T> {
    const qmp = await QmpClient.connect(socketPath);
    try {
      return await use(qmp);
    } finally {
      qmp.close();
    }
  }

  /**
   * Runs a command; resolves with its `return`.
   *
   * @throws {@link QmpCommandError} when QEMU answers with an error
   */
  execute<T = unknown>(command: string, args?: Record<string, unknown>): Promise<T> {
    if (this.#closed) return Promise.reject(this.#closed);
    const id = this.#nextId++;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: resolve as (value: unknown) => void, reject, command });
      this.#socket.write(`${JSON.stringify({ execute: command, ...(args && { arguments: args }), id })}\n`);
    });
  }

  /** Calls `listener` with each event QEMU sends from now on. */
  onEvent(listener: (event: { event: string; data?: unknown }) => void): void {
    this.#listeners.push(listener);
  }

  close(): void {
    this.#socket.end();
    this.#socket.destroy();
  }

  #receive(chunk: string): void {
    this.#buffer += chunk;
    for (let newline = this.#buffer.indexOf('\n'); newline >= 0; newline = this.#buffer.indexOf('\n')) {
      const line = this.#buffer.slice(0, newline).trim();
      this.#buffer = this.#buffer.slice(newline + 1);
      if (line === '') continue;
      const message = JSON.parse(line) as {
        id?: number;
        return?: unknown;
        error?: { class: string; desc: string };
        event?: string;
        data?: unknown;
      };
      if (message.event !== undefined) {
        const event = { event: message.event, data: message.data };
        this.events.push(event);
        for (const listener of this.#listeners) listener(event);
        continue;
      }
      const pending = message.id === undefined ? undefined : this.#pending.get(message.id);
      if (!pending || message.id === undefined) continue;
      this.#pending.delete(message.id);
      if (message.error) pending.reject(new QmpCommandError(pending.command, message.error.class, message.error.desc));
      else pending.resolve(message.return);
    }
  }

  #fail(error: Error): void {
    this.#closed ??= error;
    for (const pending of this.#pending.values()) pending.reject(error);
    this.#pending.clear();
  }
}
