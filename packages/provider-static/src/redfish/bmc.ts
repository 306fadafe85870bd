import { PowerState } from '@bmaas/bmdb-model';
import type { AcceptedPowerCommand } from '@bmaas/shepherd-manager';
import type { Bmc } from '../bmc.js';
import type { InventoryBootMode } from '../inventory.js';
import type { RedfishBootOverrideResult } from './boot-override.js';
import type { RedfishClient, RedfishMediaResult } from './client.js';
import { POWER_OFF_TYPES, POWER_ON_TYPES, type ResetType, SHUTDOWN_TYPES } from './reset-types.js';
import type { RedfishTarget } from './target.js';

/**
 * A machine's BMC over Redfish: its ComputerSystem's `PowerState`, and the
 * `#ComputerSystem.Reset` action: `On` (else `ForceOn`) to power on,
 * `ForceOff` or `GracefulShutdown` to power off, and for a power cycle the type
 * {@link chooseResetType} picks (`ForceRestart`, else `PowerCycle`, else
 * `GracefulRestart`; `resetType` overrides). An agent boot inserts the ISO
 * in its CD virtual media and sets a one-time boot override (`Cd`, or
 * `Pxe` for a network boot). Requests go through `client`,
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

  async setNetworkBootOnce(bootMode: InventoryBootMode | undefined, signal?: AbortSignal): Promise<string> {
    return describeOverride(
      await this.client.setBootOverrideOnce(this.target, 'Pxe', { mode: redfishBootMode(bootMode) }, signal),
    );
  }

  /** Makes the next boot, and only it, start from the virtual CD (see {@link RedfishClient.setBootOverrideOnce}). */
  async setCdBootOnce(bootMode: InventoryBootMode | undefined, signal?: AbortSignal): Promise<string> {
    return describeOverride(
      await this.client.setBootOverrideOnce(this.target, 'Cd', { mode: redfishBootMode(bootMode) }, signal),
    );
  }

  /** Inserts the ISO at `image` in the CD virtual media, ejecting what is there (see {@link RedfishClient.insertVirtualMedia}). */
  insertVirtualMedia(image: string, signal?: AbortSignal): Promise<RedfishMediaResult> {
    return this.client.insertVirtualMedia(this.target, image, signal);
  }

  /** Ejects the CD virtual media's image if it is `image`, and nothing else (see {@link RedfishClient.ejectVirtualMedia}). */
  ejectVirtualMedia(image: string, signal?: AbortSignal): Promise<RedfishMediaResult> {
    return this.client.ejectVirtualMedia(this.target, image, signal);
  }
}

function redfishBootMode(bootMode: InventoryBootMode | undefined): 'UEFI' | 'Legacy' | undefined {
  return bootMode === undefined ? undefined : bootMode === 'uefi' ? 'UEFI' : 'Legacy';
}

function describeOverride(result: RedfishBootOverrideResult): string {
  const mode = result.mode === undefined ? '' : `, ${result.mode}`;
  const kept = result.attempts === 1 ? '' : ` (kept at attempt ${result.attempts})`;
  return `boot override ${result.target} (Once${mode})${kept}`;
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
