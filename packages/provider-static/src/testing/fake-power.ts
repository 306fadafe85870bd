import { performance } from 'node:perf_hooks';

/** A power state as a Redfish ComputerSystem reports it. */
export type FakePowerState = 'On' | 'Off' | 'PoweringOn' | 'PoweringOff';

/**
 * What the fake BMC does to a system's power: the one thing that differs
 * between a simulated machine and a real one behind the fake (a QEMU VM).
 * The fake maps Redfish reset types onto these calls and answers 409 with
 * the message of a {@link FakePowerRefusal}.
 */
export interface FakePowerBackend {
  /** The power state now. */
  state(): Promise<FakePowerState>;
  /** `On`, `ForceOn`. Already on: nothing happens. */
  on(): Promise<void>;
  /** `ForceOff` (`graceful` false), `GracefulShutdown` (true). Already off: nothing happens. */
  off(graceful: boolean): Promise<void>;
  /**
   * `ForceRestart`, `GracefulRestart`, `PowerCycle`.
   *
   * @throws {@link FakePowerRefusal} for a system that is off, as many BMCs refuse
   */
  restart(): Promise<void>;
  /**
   * The device the system boots from next (`Boot.BootSourceOverrideTarget`,
   * `None` when the override is disabled). Optional: simulated power keeps
   * no boot device, the fake records the override all the same.
   */
  setBootSource?(target: FakeBootSource): Promise<void>;
  /**
   * The ISO in the system's virtual CD: its URL when inserted, `undefined`
   * when ejected. Optional: the fake records the media all the same.
   */
  setMedia?(image: string | undefined): Promise<void>;
}

/** Boot source overrides the fake accepts (Redfish `BootSourceOverrideTarget`). */
export const FAKE_BOOT_SOURCES = ['None', 'Pxe', 'Hdd', 'Cd'] as const;
export type FakeBootSource = (typeof FAKE_BOOT_SOURCES)[number];

/** The fake BMC refuses the request (409 Conflict), with this message. */
export class FakePowerRefusal extends Error {
  override name = 'FakePowerRefusal';
}

/** Where simulated power is headed, and since when (performance.now()). */
interface Switch {
  readonly to: 'On' | 'Off';
  readonly at: number;
}

/**
 * Simulated power: a change takes `transition` ms, during which the system
 * reports `PoweringOn` or `PoweringOff`; a restart powers it off and on
 * within that time (it reports `PoweringOn`). A system that is off, or
 * powering off, refuses a restart.
 */
export class SimulatedPower implements FakePowerBackend {
  #switch: Switch;

  constructor(
    initial: 'On' | 'Off' = 'On',
    private readonly transition = 0,
    private readonly now: () => number = () => performance.now(),
  ) {
    if (!(transition >= 0) || !Number.isFinite(transition)) {
      throw new RangeError(`fake Redfish: power transition must be >= 0 ms, got ${transition}`);
    }
    this.#switch = { to: initial, at: Number.NEGATIVE_INFINITY };
  }

  async state(): Promise<FakePowerState> {
    return this.#now();
  }

  async on(): Promise<void> {
    this.#switchTo('On');
  }

  async off(): Promise<void> {
    this.#switchTo('Off');
  }

  async restart(): Promise<void> {
    const state = this.#now();
    if (state === 'Off' || state === 'PoweringOff') {
      throw new FakePowerRefusal(`the system is ${state === 'Off' ? 'powered off' : 'powering off'}`);
    }
    this.#switch = { to: 'On', at: this.now() };
  }

  #now(): FakePowerState {
    const { to, at } = this.#switch;
    if (this.now() - at >= this.transition) return to;
    return to === 'On' ? 'PoweringOn' : 'PoweringOff';
  }

  #switchTo(to: 'On' | 'Off'): void {
    if (this.#switch.to === to) return;
    this.#switch = { to, at: this.now() };
  }
}
