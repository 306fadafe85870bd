import type { PowerState } from '@bmaas/bmdb-model';
import { ShepherdError } from './provider.js';

/**
 * A provider's reply to a power request: the command it accepted, in its own
 * words (Redfish `ForceOff`, Equinix `power_off`, the dummy's `simulated
 * off`), for logs and the machine's operator history. (The `shepherd power`
 * verbs are the CLI's `PowerCommand`.)
 */
export interface AcceptedPowerCommand {
  readonly command: string;
}

/**
 * Power control of a provider's machines, by provider ID: what the
 * recoverer (to power-cycle a machine whose agent went silent, or power on
 * one found off), the
 * power sync (to read every machine's power state) and an operator's power
 * actions need. The port is theirs, so it is declared here; the dummy
 * provider (simulated), the Equinix provider (device actions) and the static
 * provider (each machine's BMC) implement it.
 *
 * A provider that cannot do an action throws {@link NotImplementedError}
 * naming it; a machine it does not know, {@link MachineNotFoundError}; a
 * power cycle it sent but got no answer to, {@link PowerOutcomeUnknownError}.
 */
export interface PowerControl {
  /** The provider's name, as stored in `machine_provided.provider`. */
  readonly type: string;
  /** The machine's power state now; `Unknown` when the provider answers without saying. */
  readPowerState(id: string, signal?: AbortSignal): Promise<PowerState>;
  /** Powers the machine on; resolves once the provider accepted it (the machine may still be powering on). */
  powerOn(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand>;
  /** Powers the machine off, at once or (`graceful`) by asking its OS to shut down. */
  powerOff(id: string, options: { readonly graceful: boolean }, signal?: AbortSignal): Promise<AcceptedPowerCommand>;
  /**
   * Power-cycles the machine (a hard restart), for the recoverer and an
   * operator's `shepherd power cycle` alike, without waiting for it to come
   * back. Never sent twice: a cycle whose answer did not come throws
   * {@link PowerOutcomeUnknownError}.
   */
  powerCycle(id: string, signal?: AbortSignal): Promise<AcceptedPowerCommand>;
}

/**
 * A power action went out and no answer came back (a timeout, or a
 * connection that broke once the request was sent): the BMC may have acted.
 * Thrown instead of sending again an action that acts again when repeated (a
 * power cycle), which would power-cycle the machine twice. The cause is
 * the protocol's own error, naming the machine and BMC.
 */
export class PowerOutcomeUnknownError extends ShepherdError {
  override name = 'PowerOutcomeUnknownError';
  constructor(
    /** The machine's provider ID. */
    readonly machine: string,
    /** What the BMC was told (`ForceRestart`, `chassis power reset`). */
    readonly command: string,
    cause: Error,
  ) {
    super(
      `${cause.message}; the BMC may have acted on ${command}: not sent again (a second one would act twice); read the power state before trying again`,
      { cause },
    );
  }
}
