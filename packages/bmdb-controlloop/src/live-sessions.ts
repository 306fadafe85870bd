import { describeError } from '@bmaas/common';
import { log } from './internal/log.js';
import type { Session } from './session.js';

/**
 * The sessions a BMDB connection started and that have not ended yet, and
 * the collector of expired sessions that runs while any of them lives: a
 * connection without sessions leaves the database alone.
 */
export class LiveSessions {
  readonly #sessions = new Map<string, Session>();
  #collector: NodeJS.Timeout | undefined;

  /** `collect` deletes the expired sessions of every connection (`BMDB.collectExpiredSessions`). */
  constructor(private readonly collect: () => Promise<unknown>) {}

  /** Holds `session`, and collects every `interval` ms from now on if not already collecting. */
  add(session: Session, interval: number): void {
    this.#sessions.set(session.id, session);
    if (this.#collector) return;
    this.#collector = setInterval(() => {
      this.collect().catch((error) => log.session('collecting expired sessions failed: %s', describeError(error)));
    }, interval);
    this.#collector.unref();
  }

  /** Forgets session `sessionId` (closed or expired); the last one stops the collector. */
  remove(sessionId: string): void {
    this.#sessions.delete(sessionId);
    if (this.#sessions.size === 0) this.stopCollecting();
  }

  /** The sessions still live, in the order they started. */
  all(): Session[] {
    return [...this.#sessions.values()];
  }

  stopCollecting(): void {
    clearInterval(this.#collector);
    this.#collector = undefined;
  }
}
