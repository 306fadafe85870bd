import { PowerState } from '@bmaas/bmdb-model';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';
import { type Bmc, BOOT_OVERRIDE_ATTEMPTS } from '../bmc.js';
import { BootOverrideIgnoredError } from '../errors.js';
import { log } from '../internal/log.js';
import type { InventoryBootMode } from '../inventory.js';
import type { IpmiClient, IpmiPowerAction } from './client.js';
import { bmcName, type IpmiTarget } from './target.js';

/**
 * A machine's BMC over IPMI, through `ipmitool` (the {@link Bmc} port's
 * second implementation, beside Redfish): `chassis power status` for the
 * state (IPMI knows only on and off), `on`, `off` (hard) or `soft` (ACPI
 * shutdown, graceful), and for a power cycle `chassis power reset`, the hard reset
 * that restarts a hung OS, as Redfish's `ForceRestart`; a one-time network
 * boot is `chassis bootdev pxe` (`options=efiboot` unless the machine is
 * legacy), read back with `chassis bootparam get 5`. Commands go through
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

  /**
   * `chassis bootdev pxe` for the next boot, `options=efiboot` unless
   * `bootMode` is legacy (IPMI cannot read a machine's boot mode: UEFI is
   * today's default), read back from the boot flags' device selector, as
   * Ironic reads it. Not held to the flags' valid or EFI bits: `ipmi_sim`
   * keeps neither.
   */
  async setNetworkBootOnce(bootMode: InventoryBootMode | undefined, signal?: AbortSignal): Promise<string> {
    const efiboot = bootMode !== 'legacy';
    const command = `chassis bootdev pxe${efiboot ? ' options=efiboot' : ''}`;
    let readBack = '';
    for (let attempt = 1; attempt <= BOOT_OVERRIDE_ATTEMPTS; attempt++) {
      await this.client.setBootDevice(this.target, 'pxe', { efiboot }, signal);
      readBack = await this.client.nextBootDevice(this.target, signal);
      if (/\bPXE\b/i.test(readBack)) return attempt === 1 ? command : `${command} (kept at attempt ${attempt})`;
      log.ipmi(
        'machine %s: %s ignored %s (attempt %d of %d): boot device reads %s',
        this.target.machine,
        bmcName(this.target),
        command,
        attempt,
        BOOT_OVERRIDE_ATTEMPTS,
        readBack,
      );
    }
    throw new BootOverrideIgnoredError(
      this.target.machine,
      'ipmi',
      bmcName(this.target),
      `pxe (next boot${efiboot ? ', EFI' : ''})`,
      readBack,
      BOOT_OVERRIDE_ATTEMPTS,
    );
  }

  async #power(action: IpmiPowerAction, signal: AbortSignal | undefined): Promise<AcceptedPowerCommand> {
    await this.client.power(this.target, action, signal);
    return { command: `chassis power ${action}` };
  }
}
