import { PowerState } from '@bmaas/bmdb-controlloop';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';
import type { Bmc } from '../bmc.js';
import type { RedfishClient } from './client.js';
import { POWER_OFF_TYPES, POWER_ON_TYPES, type ResetType, SHUTDOWN_TYPES } from './reset-types.js';
import type { RedfishTarget } from './target.js';

/**
 * A machine's BMC over Redfish: its ComputerSystem's `PowerState`, and the
 * `#ComputerSystem.Reset` action: `On` (else `ForceOn`) to power on,
 * `ForceOff` or `GracefulShutdown` to power off, and for a power cycle the type
 * {@link chooseResetType} picks (`ForceRestart`, else `PowerCycle`, else
 * `GracefulRestart`; `resetType` overrides). Requests go through `client`,
 * whose concurrency bound holds across the fleet.
 */
export class RedfishBmc implements Bmc {
  constructor(
    private readonly client: RedfishClient,
    private readonly target: RedfishTarget,
    private readonly options: { readonly resetType?: ResetType | undefined } = {},
  ) {}

  async powerState(signal?: AbortSignal): Promise<PowerState> {
    return powerStateOf((await this.client.getSystem(this.target, signal)).powerState);
  }

  async powerOn(signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    const reset = await this.client.powerSystem(this.target, POWER_ON_TYPES, 'power on', signal);
    return { command: reset.resetType };
  }

  async powerOff(options: { readonly graceful: boolean }, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    const [types, purpose] = options.graceful
      ? [SHUTDOWN_TYPES, 'shut down gracefully']
      : [POWER_OFF_TYPES, 'power off'];
    const reset = await this.client.powerSystem(this.target, types, purpose, signal);
    return { command: reset.resetType };
  }

  async powerCycle(signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    const reset = await this.client.powerCycleSystem(this.target, { resetType: this.options.resetType }, signal);
    return { command: reset.resetType };
  }
}

const REDFISH_POWER_STATES: readonly string[] = [
  PowerState.On,
  PowerState.Off,
  PowerState.PoweringOn,
  PowerState.PoweringOff,
];

/** A ComputerSystem's `PowerState` as the shepherd's: unknown when absent or one the shepherd has no word for (`Paused`). */
export function powerStateOf(value: string | undefined): PowerState {
  return value !== undefined && REDFISH_POWER_STATES.includes(value) ? (value as PowerState) : PowerState.Unknown;
}
