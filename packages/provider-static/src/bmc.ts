import type { PowerState } from '@bmaas/bmdb-controlloop';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';

/**
 * One machine's baseboard management controller, as the static provider
 * uses it: read the power state, power on, power off and power-cycle. A port: the Redfish client
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
}
