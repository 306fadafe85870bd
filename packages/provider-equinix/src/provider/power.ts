import type { PowerState } from '@bmaas/bmdb-model';
import { type AcceptedPowerCommand, NotImplementedError, type PowerControl } from '@bmaas/shepherd-manager';
import type { DeviceAction, EquinixClient } from '../api/client.js';
import { log } from '../internal/log.js';
import { EQUINIX_PROVIDER, powerStateForState } from './device-facts.js';
import { notFound } from './provider.js';

/**
 * Power control of Equinix Metal devices, by device ID: the device's
 * `state` for reading (`active` On, `inactive` Off, `powering_on`/`_off`),
 * and the device actions `power_on`, `power_off` and `reboot`. The API has
 * no graceful power off: asked for one, it says so by name
 * ({@link NotImplementedError}). Needs only the API client, so `shepherd
 * power` builds it without the provider's SSH key.
 *
 * @example
 * ```ts
 * const power = new EquinixPower(client);
 * console.log(await power.readPowerState(deviceId)); // On
 * ```
 */
export class EquinixPower implements PowerControl {
  /** The provider name in the BMDB: `Equinix`. */
  readonly type = EQUINIX_PROVIDER;

  constructor(private readonly client: EquinixClient) {}

  /** @throws {@link MachineNotFoundError} when the API does not know the device */
  async readPowerState(id: string, signal?: AbortSignal): Promise<PowerState> {
    try {
      return powerStateForState((await this.client.getDevice(id, signal)).state);
    } catch (error) {
      throw notFound(error, id);
    }
  }

  async powerOn(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return this.#act(id, 'power_on', signal);
  }

  async powerOff(
    id: string,
    options: { readonly graceful: boolean },
    signal?: AbortSignal,
  ): Promise<AcceptedPowerCommand> {
    if (options.graceful) {
      throw new NotImplementedError(EQUINIX_PROVIDER, 'a graceful power off (the API has power_off only)');
    }
    return this.#act(id, 'power_off', signal);
  }

  /** A `reboot` action: the power cycle of the recoverer and of `shepherd power cycle`. */
  async powerCycle(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand> {
    return this.#act(id, 'reboot', signal);
  }

  async #act(id: string, action: DeviceAction, signal: AbortSignal | undefined): Promise<AcceptedPowerCommand> {
    try {
      await this.client.deviceAction(id, action, signal);
    } catch (error) {
      throw notFound(error, id);
    }
    log.provider('device %s: %s accepted', id, action);
    return { command: action };
  }
}
