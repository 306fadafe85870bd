import { BmaasServerError } from './errors.js';
import type { ServerMetrics } from './metrics.js';

/**
 * What one client, and all of them together, may hold of the server. A
 * request is *buffered* from the first byte of its body until it is
 * answered (or, on the gRPC library's routes, its answer is sent or its
 * client went): its body while it arrives, then the request decoded (a
 * gzipped message counted again as it inflates) while its handler waits on
 * the database. That is what a client that never finishes its requests, or
 * sends them faster than the database answers, would make the server keep.
 * Durations in milliseconds.
 */
export interface ServerLimits {
  /** Connections open at once (of each worker); past it a new one is closed as it is accepted. Default 20,000. */
  readonly connections: number;
  /** Streams one HTTP/2 connection may have open at once (its SETTINGS_MAX_CONCURRENT_STREAMS). Default 100. */
  readonly streamsPerConnection: number;
  /** Bytes of requests not yet answered one connection may have buffered. Default 16 MiB. */
  readonly bufferedBytesPerConnection: number;
  /** Bytes of requests not yet answered all connections together may have buffered. Default 256 MiB. */
  readonly bufferedBytes: number;
  /** How long a request may take from its headers to its answer. Default 30 s. */
  readonly requestTimeout: number;
  /** How long an HTTP/2 connection may go without a new request (a GOAWAY: a request under way finishes), or an HTTP/1.1 one without a byte, before it is closed. Default 5 minutes. */
  readonly idleTimeout: number;
}

/**
 * The defaults: an agent keeps one connection and calls one heartbeat at a
 * time, of a few kilobytes (a hardware report at most tens), every few
 * seconds to minutes; four of the largest messages a call takes (4 MiB) fit
 * in one connection's share. Each connection is a file descriptor: 20,000
 * stay well under the open files a service is let have (systemd's 524,288,
 * which Node takes as its own), with room for the database's.
 */
export const DEFAULT_LIMITS: ServerLimits = {
  connections: 20_000,
  streamsPerConnection: 100,
  bufferedBytesPerConnection: 16 * 1024 * 1024,
  bufferedBytes: 256 * 1024 * 1024,
  requestTimeout: 30_000,
  idleTimeout: 300_000,
};

/** The name of each limit in messages: the option's. */
type LimitName = keyof ServerLimits;

/** Why a request was cut off: a limit it passed. */
export type Overrun = 'bufferedBytesPerConnection' | 'bufferedBytes' | 'requestTimeout';

/** `given` over the defaults, each checked: whole numbers above zero, a connection's share at most the whole. */
export function serverLimits(given: Partial<ServerLimits> = {}): ServerLimits {
  const limits = { ...DEFAULT_LIMITS, ...given };
  for (const [name, value] of Object.entries(limits) as [LimitName, number][]) {
    if (!Number.isSafeInteger(value) || value < 1) {
      throw new BmaasServerError(`server limits: ${name} must be a whole number above zero, got ${value}`);
    }
  }
  // HTTP/2 settings are 32-bit; timers wait at most 2^31-1 ms.
  if (limits.streamsPerConnection > 2 ** 32 - 1) {
    throw new BmaasServerError(`server limits: streamsPerConnection must be at most 4294967295`);
  }
  for (const name of ['requestTimeout', 'idleTimeout'] as const) {
    if (limits[name] > 2 ** 31 - 1) throw new BmaasServerError(`server limits: ${name} must be at most 2147483647 ms`);
  }
  if (limits.bufferedBytesPerConnection > limits.bufferedBytes) {
    throw new BmaasServerError(
      `server limits: bufferedBytesPerConnection (${limits.bufferedBytesPerConnection}) is more than bufferedBytes (${limits.bufferedBytes})`,
    );
  }
  return limits;
}

/**
 * The bytes of requests not yet answered, per connection and in all, held
 * against {@link ServerLimits}: a chunk that would pass either share is not
 * taken, and its request is cut off.
 */
export class RequestBudget {
  readonly limits: ServerLimits;
  readonly #metrics: ServerMetrics | undefined;
  readonly #held = new WeakMap<object, number>();
  #total = 0;

  constructor(limits: ServerLimits, metrics: ServerMetrics | undefined) {
    this.limits = limits;
    this.#metrics = metrics;
    metrics?.readBufferedFrom(this);
  }

  /** Bytes buffered now, of every connection. */
  get buffered(): number {
    return this.#total;
  }

  /** A request on `connection` (an HTTP/2 connection, or the socket of an HTTP/1.1 one), held until {@link HeldBody.release}. */
  hold(connection: object): HeldBody {
    return new HeldBody(this, connection);
  }

  /** @internal Takes `bytes` for `connection`, or says which share it would pass (taking nothing). */
  take(connection: object, bytes: number): Overrun | undefined {
    const held = this.#held.get(connection) ?? 0;
    if (held + bytes > this.limits.bufferedBytesPerConnection) return this.overrun('bufferedBytesPerConnection');
    if (this.#total + bytes > this.limits.bufferedBytes) return this.overrun('bufferedBytes');
    this.#held.set(connection, held + bytes);
    this.#total += bytes;
    return undefined;
  }

  /** @internal Gives back what `connection` held of one request. */
  give(connection: object, bytes: number): void {
    if (bytes === 0) return;
    // Kept at zero, not deleted: the connection's next request would add it again, and the table would shrink and
    // grow by turns, rehashing (it goes with the connection, a weak key).
    this.#held.set(connection, (this.#held.get(connection) ?? 0) - bytes);
    this.#total -= bytes;
  }

  /** Counts a request cut off for `limit`, and returns it. */
  overrun<Limit extends Overrun>(limit: Limit): Limit {
    this.#metrics?.cutOff.inc({ limit });
    return limit;
  }
}

/** One request's share of a {@link RequestBudget}: its body's bytes, and what its message inflated to. */
export class HeldBody {
  #bytes = 0;
  #released = false;

  constructor(
    private readonly budget: RequestBudget,
    private readonly connection: object,
  ) {}

  /** Takes a chunk of the body (or of the inflated message); a limit it would pass, if so (the chunk is then not taken). */
  take(bytes: number): Overrun | undefined {
    if (this.#released) return undefined;
    const overrun = this.budget.take(this.connection, bytes);
    if (overrun === undefined) this.#bytes += bytes;
    return overrun;
  }

  /** The request is answered, or its stream ended with nothing else holding it: its bytes are no longer held. Idempotent. */
  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.budget.give(this.connection, this.#bytes);
    this.#bytes = 0;
  }
}

/**
 * What a client is told when its request passed `overrun`, naming the limit
 * and its value; a request timed out after its body was `whole` was waiting
 * for its answer.
 */
export function overrunMessage(overrun: Overrun, limits: ServerLimits, whole = false): string {
  switch (overrun) {
    case 'bufferedBytesPerConnection':
      return `request cut off: this connection's requests not yet answered passed ${limits.bufferedBytesPerConnection} bytes`;
    case 'bufferedBytes':
      return `request cut off: the server holds ${limits.bufferedBytes} bytes of requests not yet answered`;
    case 'requestTimeout':
      return `request cut off: not ${whole ? 'answered' : 'whole'} within ${limits.requestTimeout} ms`;
  }
}
