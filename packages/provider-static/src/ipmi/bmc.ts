import { PowerState } from '@bmaas/bmdb-controlloop';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';
import type { Bmc } from '../bmc.js';
import type { IpmiClient, IpmiPowerAction } from './client.js';
import type { IpmiTarget } from './target.js';

/**
 * A machine's BMC over IPMI, through `ipmitool` (the {@link Bmc} port's
 * second implementation, beside Redfish): `chassis power status` for the
 * state (IPMI knows only on and off), `on`, `off` (hard) or `soft` (ACPI
 * shutdown, graceful), and for a power cycle `chassis power reset`, the hard reset
 * that restarts a hung OS, as Redfish's `ForceRestart`. Commands go through
 * `client`, whose bound on commands in flight holds across the fleet.
 */
export class IpmiBmc implements Bmc {
  constructor(
    private readonly client: IpmiClient,
    private readonly target: IpmiTarget,
  ) {}

  async powerState(signal?: AbortSignal): Promise<PowerState> {
    return (await this.client.powerState(this.target, signal)) === 'On' ? PowerState.On : PowerState.Off;
  }

  powerOn(signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return this.#power('on', signal);
  }

  powerOff(options: { readonly graceful: boolean }, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return this.#power(options.graceful ? 'soft' : 'off', signal);
  }

  powerCycle(signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return this.#power('reset', signal);
  }

  async #power(action: IpmiPowerAction, signal: AbortSignal | undefined): Promise<AcceptedPowerCommand> {
    await this.client.power(this.target, action, signal);
    return { command: `chassis power ${action}` };
  }
}
