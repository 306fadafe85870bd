import { describeError } from '@bmaas/common';
import pg from 'pg';
import { CHANGES_CHANNEL } from '../sql/end-work.js';
import { detail, log } from './log.js';

/** Pause before listening again after the listening connection failed. */
const RECONNECT_PAUSE = 1_000;

/**
 * Notifications that machines may have become eligible, from one listening
 * connection per BMDB connection. Idle control-loop workers wait on it
 * instead of sleeping out their idle delay; the delay stays as the fallback
 * for what no statement announces (backoffs and heartbeats aging) and for
 * while the listening connection is down.
 *
 * A worker reads {@link MachineChanges.generation} before it looks for work,
 * and waits for a later one: a change announced while it was looking is not
 * missed. A notification wakes one waiting worker, not all of them: a worker
 * that then finds work wakes the next ({@link MachineChanges.wakeOne}), so a
 * burst of new machines is taken up one worker after another, and a single
 * machine costs one wasted look instead of one per idle worker.
 */
export class MachineChanges {
  #generation = 0;
  readonly #waiters = new Set<() => void>();
  #client: pg.Client | undefined;
  #connecting = false;
  #retryAt = 0;
  #closed = false;

  constructor(private readonly config: pg.ClientConfig) {}

  /** Counts notifications (and reconnections, after which changes may have gone unheard). */
  get generation(): number {
    return this.#generation;
  }

  /** How many workers wait for a notification now (idle, with nothing to do). */
  get waiting(): number {
    return this.#waiters.size;
  }

  /** Whether the listening connection is up. */
  get listening(): boolean {
    return this.#client !== undefined;
  }

  /**
   * Waits until a notification later than `generation`, at most `ms`. Returns
   * at once if one came already. Rejects with the signal's reason when it aborts.
   */
  async wait(generation: number, ms: number, signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    this.#listen();
    if (this.#generation !== generation) return;
    await new Promise<void>((resolve, reject) => {
      const settle = () => {
        clearTimeout(timer);
        this.#waiters.delete(wake);
        signal.removeEventListener('abort', abort);
      };
      const wake = () => {
        settle();
        resolve();
      };
      const abort = () => {
        settle();
        reject(signal.reason);
      };
      const timer = setTimeout(wake, ms);
      this.#waiters.add(wake);
      signal.addEventListener('abort', abort, { once: true });
    });
  }

  /** Wakes the longest-waiting worker, if any: there may be more work than one. */
  wakeOne(): void {
    const [first] = this.#waiters;
    first?.();
  }

  /** Stops listening; waiting workers fall back to their timeouts. */
  async close(): Promise<void> {
    this.#closed = true;
    const client = this.#client;
    this.#client = undefined;
    await client?.end().catch(() => undefined);
  }

  /** Connects and LISTENs unless already (or recently failed, or closed). */
  #listen(): void {
    if (this.#closed || this.#client || this.#connecting || Date.now() < this.#retryAt) return;
    this.#connecting = true;
    const client = new pg.Client(this.config);
    const lost = (error?: Error) => {
      if (this.#client === client) this.#client = undefined;
      if (error) log.connection('listening connection failed: %s', describeError(error));
      this.#retryAt = Date.now() + RECONNECT_PAUSE;
    };
    client.on('error', (error) => {
      lost(error);
      client.end().catch(() => undefined);
    });
    client.on('end', () => lost());
    client.on('notification', () => this.#changed('one'));
    (async () => {
      await client.connect();
      await client.query(`LISTEN ${CHANGES_CHANNEL}`);
      if (this.#closed) {
        await client.end();
        return;
      }
      this.#client = client;
      detail.connection('listening for machine changes');
      // Changes made while nobody listened went unheard: have every waiter look.
      this.#changed('all');
    })()
      .catch((error: unknown) => {
        lost(error instanceof Error ? error : new Error(String(error)));
        client.end().catch(() => undefined);
      })
      .finally(() => {
        this.#connecting = false;
      });
  }

  #changed(wake: 'one' | 'all'): void {
    this.#generation++;
    if (wake === 'one') this.wakeOne();
    else for (const waiter of [...this.#waiters]) waiter();
  }
}
