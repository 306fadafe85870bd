/** A counting semaphore with FIFO hand-off and abortable waits. */
export class Semaphore {
  #active = 0;
  readonly #queue: Array<{ grant: () => void }> = [];

  constructor(readonly limit: number) {
    if (!Number.isSafeInteger(limit) || limit < 1) {
      throw new RangeError(`concurrency limit must be a positive integer, got ${limit}`);
    }
  }

  /** Slots held right now. */
  get active(): number {
    return this.#active;
  }

  /**
   * Waits for a slot. Resolves to its release function (idempotent); rejects
   * with the signal's reason if `signal` aborts first, taking no slot.
   */
  acquire(signal?: AbortSignal): Promise<() => void> {
    signal?.throwIfAborted();
    if (this.#active < this.limit) {
      this.#active++;
      return Promise.resolve(this.#releaser());
    }
    return new Promise((resolve, reject) => {
      const waiter = {
        grant: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve(this.#releaser());
        },
      };
      const onAbort = () => {
        const index = this.#queue.indexOf(waiter);
        if (index >= 0) this.#queue.splice(index, 1);
        reject(signal?.reason);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#queue.push(waiter);
    });
  }

  #releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#queue.shift();
      // The slot passes straight to the next waiter: #active stays the same.
      if (next) next.grant();
      else this.#active--;
    };
  }
}
