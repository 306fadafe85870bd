import type { PowerState } from '@bmaas/bmdb-model';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';
import type { InventoryBootMode } from './inventory.js';

/** Times a one-time boot override is set before giving up on a BMC that ignores it (Ironic tries as often). */
export const BOOT_OVERRIDE_ATTEMPTS = 3;

/**
 * One machine's baseboard management controller, as the static provider
 * uses it: read the power state, power on, power off and power-cycle, and
 * make the next boot a network boot. A port: the Redfish client
 * is its first implementation (`RedfishBmc`); the provider picks one per
 * inventory machine. Each call resolves once the BMC accepted the request,
 * with the BMC's own name for what it was told.
 */
export interface Bmc {
  /** The system's power state now; `Unknown` when the BMC does not say. */
  powerState(signal?: AbortSignal): Promise<PowerState>;
  /** Powers the system on. */
  powerOn(signal?: AbortSignal): Promise<AcceptedPowerCommand>;
  /** Cuts the system's power, or (`graceful`) asks its OS to shut down. */
  powerOff(options: { readonly graceful: boolean }, signal?: AbortSignal): Promise<AcceptedPowerCommand>;
  /**
   * Power-cycles the system: a hard restart where the BMC allows one (or the
   * reset configured for it). Sent once: without an answer it throws
   * `PowerOutcomeUnknownError` (a second one could reset the machine twice).
   */
  powerCycle(signal?: AbortSignal): Promise<AcceptedPowerCommand>;
  /**
   * Makes the next boot, and only it, a network boot (PXE) in `bootMode`:
   * set, read back and set again while the BMC ignores it, at most
   * {@link BOOT_OVERRIDE_ATTEMPTS} times. Resolves with what the BMC was
   * told, for logs and history.
   *
   * @throws {@link BootOverrideIgnoredError} when the BMC still says otherwise after the last attempt
   */
  setNetworkBootOnce(bootMode: InventoryBootMode | undefined, signal?: AbortSignal): Promise<string>;
}
