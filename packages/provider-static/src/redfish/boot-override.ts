import { BOOT_OVERRIDE_ATTEMPTS } from '../bmc.js';
import { BmcUnsupportedError, BootOverrideIgnoredError } from '../errors.js';
import { log } from '../internal/log.js';
import { type RedfishSystem, readSystem } from './system.js';
import type { RedfishTarget } from './target.js';
import type { RedfishTransport } from './transport.js';

/** Boot sources an agent boot overrides to: the virtual CD, or the network. */
export type RedfishBootTarget = 'Cd' | 'Pxe';
/** `BootSourceOverrideMode`. */
export type RedfishBootMode = 'UEFI' | 'Legacy';

/** What the BMC kept of a one-time boot override. */
export interface RedfishBootOverrideResult {
  readonly target: RedfishBootTarget;
  /** The mode asked for: the given one, else the system's own; `undefined` when the BMC has none. */
  readonly mode: RedfishBootMode | undefined;
  /** PATCHes it took (1 when the BMC kept the first). */
  readonly attempts: number;
}

/**
 * Sets a one-time boot override (`BootSourceOverrideTarget`,
 * `BootSourceOverrideEnabled: Once`, and `BootSourceOverrideMode`: `mode`,
 * else the system's current one) by a PATCH of the ComputerSystem, reads it
 * back, and PATCHes again while the BMC did not keep it, up to
 * {@link BOOT_OVERRIDE_ATTEMPTS} times, as Ironic does. Each PATCH carries
 * the system's `ETag` as `If-Match`, where the BMC sends one.
 *
 * @throws {@link BmcUnsupportedError} when the system lists its allowable targets and `bootTarget` is not one
 * @throws {@link BootOverrideIgnoredError} when it still reads otherwise after the last attempt
 */
export async function setBootOverrideOnce(
  transport: RedfishTransport,
  target: RedfishTarget,
  bootTarget: RedfishBootTarget,
  mode: RedfishBootMode | undefined,
  signal: AbortSignal | undefined,
): Promise<RedfishBootOverrideResult> {
  let system = await readSystem(transport, target, signal);
  const allowable = system.boot.allowableTargets;
  if (allowable !== undefined && !allowable.includes(bootTarget)) {
    throw new BmcUnsupportedError(
      target.machine,
      'redfish',
      target.url,
      `boot override target ${bootTarget} is not allowed by the BMC (allowed: ${allowable.join(', ') || 'none'})`,
    );
  }
  const wantedMode = mode ?? bootModeOf(system.boot.mode);
  const boot = {
    BootSourceOverrideTarget: bootTarget,
    BootSourceOverrideEnabled: 'Once',
    ...(wantedMode === undefined ? {} : { BootSourceOverrideMode: wantedMode }),
  };
  for (let attempt = 1; attempt <= BOOT_OVERRIDE_ATTEMPTS; attempt++) {
    // The ETag of the system as last read: BMCs such as Supermicro's refuse a PATCH without it (428).
    await transport.send(target, 'PATCH', target.url, { Boot: boot }, signal, { ifMatch: system.etag });
    system = await readSystem(transport, target, signal);
    if (kept(system, bootTarget, wantedMode)) {
      log.redfish(
        'machine %s: boot override %s (Once%s) kept by %s after %d attempt(s)',
        target.machine,
        bootTarget,
        wantedMode === undefined ? '' : `, ${wantedMode}`,
        target.url,
        attempt,
      );
      return { target: bootTarget, mode: wantedMode, attempts: attempt };
    }
    log.redfish(
      'machine %s: %s ignored boot override %s (attempt %d of %d): reads %s',
      target.machine,
      target.url,
      bootTarget,
      attempt,
      BOOT_OVERRIDE_ATTEMPTS,
      describeBoot(system),
    );
  }
  throw new BootOverrideIgnoredError(
    target.machine,
    'redfish',
    target.url,
    `${bootTarget} (Once${wantedMode === undefined ? '' : `, ${wantedMode}`})`,
    describeBoot(system),
    BOOT_OVERRIDE_ATTEMPTS,
  );
}

/** Whether the system reads back the override asked for; a BMC without a mode is not held to one. */
function kept(system: RedfishSystem, bootTarget: RedfishBootTarget, mode: RedfishBootMode | undefined): boolean {
  const { boot } = system;
  return (
    boot.target === bootTarget &&
    boot.enabled === 'Once' &&
    (mode === undefined || boot.mode === undefined || boot.mode === mode)
  );
}

function describeBoot(system: RedfishSystem): string {
  const { target, enabled, mode } = system.boot;
  return `${target ?? '(no target)'} (${enabled ?? 'no BootSourceOverrideEnabled'}${mode === undefined ? '' : `, ${mode}`})`;
}

function bootModeOf(value: string | undefined): RedfishBootMode | undefined {
  return value === 'UEFI' || value === 'Legacy' ? value : undefined;
}
