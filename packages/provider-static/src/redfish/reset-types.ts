import { BmcUnsupportedError } from '../errors.js';
import type { RedfishTarget } from './target.js';

/** Reset types of Redfish's `ComputerSystem.Reset` action (DSP0268 `ResetType`). */
export const RESET_TYPES = [
  'On',
  'ForceOff',
  'GracefulShutdown',
  'GracefulRestart',
  'ForceRestart',
  'Nmi',
  'ForceOn',
  'PushPowerButton',
  'PowerCycle',
  'Suspend',
  'Pause',
  'Resume',
] as const;
export type ResetType = (typeof RESET_TYPES)[number];

/**
 * The reset types that power-cycle a machine, best first: a hard restart
 * works on a hung OS, a power cycle does too but is slower, a graceful
 * restart only when the OS still answers ACPI.
 */
export const RESTART_PREFERENCE: readonly ResetType[] = ['ForceRestart', 'PowerCycle', 'GracefulRestart'];

/**
 * The reset type to use: the override if the system allows it (or lists
 * nothing), else the first of {@link RESTART_PREFERENCE} it allows.
 */
export function chooseResetType(
  target: Pick<RedfishTarget, 'machine' | 'url'>,
  allowable: readonly string[] | undefined,
  override: ResetType | undefined,
): ResetType {
  const listed = allowable === undefined ? 'none listed' : `allowed: ${allowable.join(', ') || 'none'}`;
  if (override !== undefined) {
    if (allowable === undefined || allowable.includes(override)) return override;
    throw new BmcUnsupportedError(
      target.machine,
      'redfish',
      target.url,
      `reset type ${override} (--redfish-reset-type) is not allowed by the BMC (${listed})`,
    );
  }
  const chosen = RESTART_PREFERENCE.find((type) => allowable?.includes(type));
  if (chosen === undefined) {
    throw new BmcUnsupportedError(
      target.machine,
      'redfish',
      target.url,
      `no allowable reset type to power-cycle with (want one of ${RESTART_PREFERENCE.join(', ')}; ${listed}); ` +
        'set --redfish-reset-type if the BMC accepts one it does not list',
    );
  }
  return chosen;
}

/**
 * Reset types that leave the system as one did when sent twice (on stays on,
 * off stays off): sent again after a timeout. Any other (a restart, a power
 * cycle, the power button) would act twice.
 */
const REPEATABLE: ReadonlySet<string> = new Set<ResetType>(['On', 'ForceOn', 'ForceOff', 'GracefulShutdown']);

/** Whether sending `resetType` again could act again (restart the system twice). */
export function actsTwice(resetType: ResetType): boolean {
  return !REPEATABLE.has(resetType);
}

/** Reset types that power a system on, best first. */
export const POWER_ON_TYPES: readonly ResetType[] = ['On', 'ForceOn'];
/** The reset type that cuts a system's power. */
export const POWER_OFF_TYPES: readonly ResetType[] = ['ForceOff'];
/** The reset type that asks a system's OS to shut down. */
export const SHUTDOWN_TYPES: readonly ResetType[] = ['GracefulShutdown'];

/**
 * The first of `wanted` the system allows; the first of them when it lists
 * none (the BMC then decides).
 *
 * @throws {@link BmcUnsupportedError} when it allows none of them, naming what was wanted and what it allows
 */
export function chooseAllowed(
  target: Pick<RedfishTarget, 'machine' | 'url'>,
  allowable: readonly string[] | undefined,
  wanted: readonly ResetType[],
  purpose: string,
): ResetType {
  const chosen = allowable === undefined ? wanted[0] : wanted.find((type) => allowable.includes(type));
  if (chosen === undefined) {
    throw new BmcUnsupportedError(
      target.machine,
      'redfish',
      target.url,
      `no allowable reset type to ${purpose} with (want ${wanted.join(' or ')}; allowed: ${allowable?.join(', ') || 'none'})`,
    );
  }
  return chosen;
}
