import { performance } from 'node:perf_hooks';
import type { PowerState } from '@bmaas/bmdb-model';

/** Where one pretend machine's power is headed, and since when. */
interface Switch {
  readonly to: 'On' | 'Off';
  readonly at: number;
}

/**
 * The dummy provider's simulated power: every pretend machine is `On` until
 * told otherwise, and a change takes `transition` ms (`PoweringOn`,
 * `PoweringOff` meanwhile), as a real machine's does. A machine that is off
 * cannot be power-cycled, as many BMCs refuse a restart of a system that is
 * off. Kept in the process: each process simulates its own.
 */
export class DummyPower {
  readonly #switches = new Map<string, Switch>();

  constructor(
    private readonly transition = 0,
    private readonly now: () => number = () => performance.now(),
  ) {
    if (!(transition >= 0) || !Number.isFinite(transition)) {
      throw new RangeError(`dummy power transition must be >= 0 ms, got ${transition}`);
    }
  }

  /** The machine's power state now. */
  state(id: string): PowerState {
    const change = this.#switches.get(id);
    if (change === undefined) return 'On';
    if (this.now() - change.at >= this.transition) return change.to;
    return change.to === 'On' ? 'PoweringOn' : 'PoweringOff';
  }

  on(id: string): void {
    this.#switchTo(id, 'On');
  }

  off(id: string): void {
    this.#switchTo(id, 'Off');
  }

  /**
   * A restart: off and on again, taking the transition time.
   *
   * @throws Error when the machine is off or powering off
   */
  cycle(id: string): void {
    const state = this.state(id);
    if (state === 'Off' || state === 'PoweringOff') {
      throw new Error(`dummy machine ${id} is ${state === 'Off' ? 'off' : 'powering off'}: it cannot be power-cycled`);
    }
    this.#switches.set(id, { to: 'On', at: this.now() });
  }

  #switchTo(id: string, to: 'On' | 'Off'): void {
    const state = this.state(id);
    // Already there, or on its way: nothing changes.
    if (state === to || this.#switches.get(id)?.to === to) return;
    this.#switches.set(id, { to, at: this.now() });
  }
}
