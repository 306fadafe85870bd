import type { BMDB, MachineNames, Session } from '@bmaas/bmdb-controlloop';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { type Argv, actor, databaseSettings, optional, reason } from '../settings.js';
import { describeMachine, MachinesNotDoneError, machineTargets, unknownLines } from './machine-targets.js';

/** What `hold` and `unhold` are told, checked before anything is touched. */
interface HoldSettings {
  readonly targets: MachineNames;
  readonly reason: string | undefined;
  readonly actor: string;
}

/**
 * `shepherd hold --provider P --provider-id ID… --reason TEXT` (or
 * `--machine-id ID…`): holds the machines, so no loop claims them, and says
 * which have work running (it ends on its own). A machine already held keeps
 * its hold. Returns at once. Exits 1 for IDs the BMDB does not know, after
 * holding the others.
 */
export async function hold(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings: HoldSettings = {
    targets: machineTargets(argv, 'hold', { machineIds: true }),
    reason: reason(argv, 'hold'),
    actor: actor(argv),
  };
  await withSession(argv, 'shepherd-hold', async (session) => {
    const lookup = await session.transact((q) => q.lookUpMachines(settings.targets));
    for (const machine of lookup.found) {
      const { hold: held, placed } = await session.transact((q) =>
        q.holdMachine(machine.machineId, { reason: settings.reason as string, actor: settings.actor }),
      );
      const name = describeMachine(machine);
      if (!placed) {
        write(`${name} was already held by ${held.actor} since ${held.since.toISOString()}: ${held.reason}\n`);
        continue;
      }
      log('held %s for %s: %s', name, settings.actor, settings.reason);
      const running =
        machine.liveWork.length === 0
          ? ''
          : `; work running on it: ${machine.liveWork.join(', ')} (it ends on its own)`;
      write(`held ${name}${running}\n`);
    }
    const unknown = unknownLines(settings.targets, lookup);
    if (unknown.length > 0) throw new MachinesNotDoneError('refused', unknown);
  });
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
    const lookup = await session.transact((q) => q.lookUpMachines(settings.targets));
    for (const machine of lookup.found) {
      const released = await session.transact((q) =>
        q.unholdMachine(machine.machineId, { actor: settings.actor, reason: settings.reason }),
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

/**
 * Runs `fn` with a session of its own on the BMDB of the command's flags
 * (one that exists: an embedded one is not created); closes both after.
 */
export async function withSession<T>(
  argv: Argv,
  processor: string,
  fn: (session: Session, bmdb: BMDB) => Promise<T>,
): Promise<T> {
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, mustExist: true, attach: true });
  try {
    const session = await bmdb.startSession({ processor });
    try {
      return await fn(session, bmdb);
    } finally {
      await session.close();
    }
  } finally {
    await bmdb.close();
  }
}
