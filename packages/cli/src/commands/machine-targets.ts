import type { MachineLookup, MachineNames, MachineRef } from '@bmaas/bmdb-model';
import { isUuid } from '@bmaas/common';
import { type Argv, optional, UsageError } from '../settings.js';

/**
 * The values of a flag that takes several: repeated, space-separated after
 * one flag, or comma-separated (as `SHEPHERD_<FLAG>` carries them).
 */
export function listFlag(argv: Argv, flag: string): string[] {
  const raw = argv[flag];
  const values = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw]).map(String);
  return values.flatMap((value) => value.split(/[,\s]+/)).filter((id) => id !== '');
}

/**
 * The machines a command names: `--provider P --provider-id ID…`, or (where
 * `machineIds` allows it) `--machine-id ID…`. Checked before anything is
 * touched: a UsageError names the flag missing, given twice over, or a
 * machine ID that is no UUID.
 */
export function machineTargets(argv: Argv, command: string, options: { machineIds: boolean }): MachineNames {
  const provider = optional(argv, 'provider');
  const providerIds = listFlag(argv, 'provider-id');
  const machineIds = options.machineIds ? listFlag(argv, 'machine-id') : [];
  const either = options.machineIds ? ' (or --machine-id)' : '';
  if (machineIds.length > 0) {
    if (provider !== undefined || providerIds.length > 0) {
      throw new UsageError(
        'machine-id',
        `name the machines by --machine-id or by --provider and --provider-id, not both`,
      );
    }
    const bad = machineIds.find((id) => !isUuid(id));
    if (bad !== undefined) throw UsageError.invalid('machine-id', bad, 'a machine ID (a UUID)');
    return { machineIds };
  }
  if (provider === undefined) {
    throw new UsageError('provider', `required for ${command}${either}: the provider of the machines, as in the BMDB`);
  }
  if (providerIds.length === 0) {
    throw new UsageError('provider-id', `required for ${command}${either}: the provider IDs of the machines`);
  }
  return { provider, providerIds };
}

/** A machine as the output names it: `Static rack1-node07 (machine <id>)`, or `machine <id>` without a Provided tag. */
export function describeMachine(machine: Pick<MachineRef, 'machineId' | 'provider' | 'providerId'>): string {
  return machine.provider === null || machine.providerId === null
    ? `machine ${machine.machineId}`
    : `${machine.provider} ${machine.providerId} (machine ${machine.machineId})`;
}

/** What a lookup did not find, one line each, for a {@link MachinesNotDoneError}. */
export function unknownLines(names: MachineNames, lookup: MachineLookup): string[] {
  return lookup.unknown.map((name) =>
    'provider' in names
      ? `${names.provider} ${name}: not in the BMDB under provider ${names.provider}`
      : `machine ${name}: not in the BMDB`,
  );
}

/**
 * Some machines a command named were not acted on (unknown, refused, or the
 * action failed), after the others were: exit status 1, each named on a line.
 */
export class MachinesNotDoneError extends Error {
  override name = 'MachinesNotDoneError';
  constructor(what: string, lines: readonly string[]) {
    super(`${what} ${lines.length} machine(s):\n  ${lines.join('\n  ')}`);
  }
}
