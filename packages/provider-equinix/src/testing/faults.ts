/** Failures injected into the fake Equinix API on demand, queued per route. */
import type { ServerResponse } from 'node:http';
import type { FakeRoute } from './routes.js';

/**
 * A failure to inject into the next calls of a route. Without `status`,
 * `drop` or `malformed` the call is only delayed.
 */
export interface FakeFault {
  /** Answer with this HTTP status instead of handling the call. */
  readonly status?: number;
  /** JSON body of the `status` answer. Default `{"errors": ["injected failure"]}`. */
  readonly body?: unknown;
  /** `Retry-After` header of the `status` answer (seconds or an HTTP date). */
  readonly retryAfter?: string | number;
  /** With `status`: handle the call first (its change happens), then answer with `status`. */
  readonly afterProcessing?: boolean;
  /** Handle the call, then close the connection without answering (a lost answer). */
  readonly drop?: boolean;
  /** Handle the call, then answer 200 with a truncated JSON body. */
  readonly malformed?: boolean;
  /** Wait this long (ms) before doing anything. */
  readonly delay?: number;
  /** How many calls the fault applies to. Default 1. */
  readonly times?: number;
}

interface ActiveFault {
  readonly fault: FakeFault;
  left: number;
}

/** The pending faults of every route, each used up after its `times` calls. */
export class FaultQueue {
  readonly #faults = new Map<FakeRoute, ActiveFault[]>();

  /** Queues `fault` for the next `fault.times` (default 1) calls of `route`. */
  add(route: FakeRoute, fault: FakeFault): void {
    const queue = this.#faults.get(route) ?? [];
    queue.push({ fault, left: fault.times ?? 1 });
    this.#faults.set(route, queue);
  }

  clear(): void {
    this.#faults.clear();
  }

  /** The fault for this call of `route`, if one is pending; counts the call. */
  take(route: FakeRoute): FakeFault | undefined {
    const queue = this.#faults.get(route);
    const active = queue?.[0];
    if (!queue || !active) return undefined;
    if (--active.left <= 0) queue.shift();
    return active.fault;
  }
}

/** Answers with the fault's status, `Retry-After` and body. */
export function sendFault(res: ServerResponse, fault: FakeFault): void {
  const status = fault.status ?? 500;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (fault.retryAfter !== undefined) headers['retry-after'] = String(fault.retryAfter);
  res.writeHead(status, headers);
  res.end(JSON.stringify(fault.body ?? { errors: ['injected failure'] }));
}
