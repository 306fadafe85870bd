import { performance } from 'node:perf_hooks';
import { SessionClosedError, SessionExpiredError } from './errors.js';
import { log } from './internal/log.js';

/** Where a session stands: `live` until it expires or is closed, for good. */
export type SessionState = 'live' | 'expired' | 'closed';

/**
 * @internal Where one session stands, apart from what it does (heartbeats,
 * claims, closing: `Session`): live until its deadline passes or it is
 * closed, for good, when its signal aborts. Its work asks it whether the
 * session is live before an end, so that `Work` needs this, not `Session`.
 */
export class SessionLife {
  #state: SessionState = 'live';
  /** performance.now() after which the database certainly considers the session dead. */
  #localDeadline: number;
  readonly #abort = new AbortController();
  /** Set once the session is being given up: it takes no new work, and expires once its ends under way settle. */
  #givingUp: SessionExpiredError | undefined;

  constructor(
    /** The session's ID (its row in `sessions`). */
    readonly id: string,
    /** The metrics label the session was started with. */
    readonly processor: string,
    /** Heartbeat deadline interval, in milliseconds. */
    readonly interval: number,
    startedAt: number,
  ) {
    this.#localDeadline = startedAt + interval;
  }

  /** Aborts when the session expires (with SessionExpiredError) or closes (SessionClosedError). */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** `live`, `expired` (deadline passed) or `closed`; expires the session first if its deadline passed. */
  get state(): SessionState {
    this.checkDeadline();
    return this.#state;
  }

  /** The state as last recorded, without looking at the deadline. */
  get recordedState(): SessionState {
    return this.#state;
  }

  /** performance.now() after which the database certainly considers the session dead. */
  get localDeadline(): number {
    return this.#localDeadline;
  }

  /**
   * A heartbeat sent at `sentAt` renewed the deadline: the database's new
   * deadline is at least one interval after it, counted from a moment after
   * it was sent.
   */
  renewed(sentAt: number): void {
    this.#localDeadline = sentAt + this.interval;
  }

  /** Throws SessionExpiredError / SessionClosedError unless the session is live (and not being given up). */
  assertLive(): void {
    if (this.#givingUp) throw this.#givingUp;
    const state = this.state;
    if (state === 'closed') throw new SessionClosedError(this.id);
    if (state === 'expired') throw this.#abort.signal.reason as SessionExpiredError;
  }

  /** From now on the session takes no new work nor ends; the error every call then throws. */
  giveUp(why: string): SessionExpiredError {
    this.#givingUp ??= new SessionExpiredError(this.id, why);
    return this.#givingUp;
  }

  /** Expires the session if its deadline passed. */
  checkDeadline(): void {
    if (this.#state === 'live' && performance.now() >= this.#localDeadline) {
      this.expire('heartbeats did not reach the database before the deadline');
    }
  }

  /** Expires a live session for good: its signal aborts with SessionExpiredError. */
  expire(why: string): void {
    if (this.#state !== 'live') return;
    log.session('session %s expired: %s', this.id, why);
    this.#enter('expired', new SessionExpiredError(this.id, why));
  }

  /** Closes the session (live or expired) for good: its signal aborts with SessionClosedError if it had not. */
  close(): void {
    this.#enter('closed', new SessionClosedError(this.id));
  }

  /** The reason the session's signal aborted with; a SessionExpiredError once expired. */
  get reason(): unknown {
    return this.#abort.signal.reason;
  }

  #enter(state: 'expired' | 'closed', reason: Error): void {
    this.#state = state;
    this.#abort.abort(reason);
  }
}
