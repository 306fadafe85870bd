import type { MachineNames, MachineRef, PlacedHold } from '@bmaas/bmdb-model';
import { holdMachine, lookUpMachines, unholdMachine } from '@bmaas/bmdb-model';
import { withSession } from '../database.js';
import { log } from '../logging.js';
import { type Argv, actor, optional, reason } from '../settings.js';
import { describeMachine, MachinesNotDoneError, machineTargets, unknownLines } from './machine-targets.js';

/** What `hold` and `unhold` are told, checked before anything is touched. */
interface HoldSettings {
  readonly targets: MachineNames;
  readonly reason: string | undefined;
  readonly actor: string;
}

/** A machine as `shepherd hold --json` tells its hold. */
export interface HeldOutput {
  readonly machineId: string;
  readonly provider: string | null;
  readonly providerId: string | null;
  /** Whether this command placed the hold (false: it was already held, as `actor`, `reason`, `since` tell). */
  readonly placed: boolean;
  readonly actor: string;
  readonly reason: string;
  readonly since: string;
  /** Processes with work running on it as the hold took effect: every claim committed before it. */
  readonly liveWork: readonly string[];
  /** Its OS installation under way (its agent installing), if any. */
  readonly installing: {
    readonly generation: string;
    readonly imageUrl: string;
    readonly deliveredAt: string | null;
  } | null;
}

/** What `shepherd hold --json` prints. */
export interface HoldOutput {
  readonly held: readonly HeldOutput[];
  /** Provider IDs (or machine IDs) the BMDB does not have; the command exits 1 after printing. */
  readonly unknown: readonly string[];
}

/**
 * `shepherd hold --provider P --provider-id ID… --reason TEXT` (or
 * `--machine-id ID…`): holds the machines, so no loop claims them, and says
 * which have work running (every claim committed before the hold; it ends on
 * its own) or an OS installation under way. No claim committed after the
 * hold is on the machine. A machine already held keeps its hold. Returns at
 * once. `--json` prints {@link HoldOutput}. Exits 1 for IDs the BMDB does not
 * know, after holding the others.
 */
export async function hold(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings: HoldSettings = {
    targets: machineTargets(argv, 'hold', { machineIds: true }),
    reason: reason(argv, 'hold'),
    actor: actor(argv),
  };
  const json = argv.json === true;
  await withSession(argv, 'shepherd-hold', async (session) => {
    const lookup = await session.transact((q) => lookUpMachines(q, settings.targets));
    const held: HeldOutput[] = [];
    for (const machine of lookup.found) {
      const result = await session.transact((q) =>
        holdMachine(q, machine.machineId, { reason: settings.reason as string, actor: settings.actor }),
      );
      const output = heldOutput(machine, result);
      held.push(output);
      if (result.placed) log('held %s for %s: %s', describeMachine(machine), settings.actor, settings.reason);
      if (!json) write(heldLine(output));
    }
    if (json) write(`${JSON.stringify({ held, unknown: lookup.unknown } satisfies HoldOutput, null, 2)}\n`);
    const unknown = unknownLines(settings.targets, lookup);
    if (unknown.length > 0) throw new MachinesNotDoneError('refused', unknown);
  });
}

function heldOutput(machine: MachineRef, result: PlacedHold): HeldOutput {
  const { hold: placed, installing } = result;
  return {
    machineId: machine.machineId,
    provider: machine.provider,
    providerId: machine.providerId,
    placed: result.placed,
    actor: placed.actor,
    reason: placed.reason,
    since: placed.since.toISOString(),
    liveWork: result.liveWork,
    installing:
      installing === undefined
        ? null
        : {
            generation: installing.generation.toString(),
            imageUrl: installing.imageUrl,
            deliveredAt: installing.deliveredAt?.toISOString() ?? null,
          },
  };
}

/** A held machine's line: held, with what runs on it; or already held, by whom since when. */
function heldLine(output: HeldOutput): string {
  const name = describeMachine(output);
  if (!output.placed) return `${name} was already held by ${output.actor} since ${output.since}: ${output.reason}\n`;
  const running = [...output.liveWork];
  if (output.installing !== null) {
    const { generation, imageUrl, deliveredAt } = output.installing;
    running.push(
      `OS installation generation ${generation} of ${imageUrl} (delivered ${deliveredAt ?? 'at an unknown time'})`,
    );
  }
  return running.length === 0
    ? `held ${name}\n`
    : `held ${name}; work running on it: ${running.join(', ')} (it ends on its own)\n`;
}

/**
 * `shepherd unhold --provider P --provider-id ID…` (or `--machine-id ID…`):
 * releases the machines' holds; the loops take them up again. A machine not
 * held is said so. Exits 1 for IDs the BMDB does not know, after releasing
 * the others.
 */
export async function unhold(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings: HoldSettings = {
    targets: machineTargets(argv, 'unhold', { machineIds: true }),
    reason: optional(argv, 'reason')?.trim() || undefined,
    actor: actor(argv),
  };
  await withSession(argv, 'shepherd-hold', async (session) => {
    const lookup = await session.transact((q) => lookUpMachines(q, settings.targets));
    for (const machine of lookup.found) {
      const released = await session.transact((q) =>
        unholdMachine(q, machine.machineId, { actor: settings.actor, reason: settings.reason }),
      );
      const name = describeMachine(machine);
      if (released === undefined) {
        write(`${name} was not held\n`);
        continue;
      }
      log('released %s (held by %s since %s)', name, released.actor, released.since.toISOString());
      write(`released ${name}, held by ${released.actor} since ${released.since.toISOString()}: ${released.reason}\n`);
    }
    const unknown = unknownLines(settings.targets, lookup);
    if (unknown.length > 0) throw new MachinesNotDoneError('refused', unknown);
  });
}
