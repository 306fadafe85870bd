import type { Session } from '@bmaas/bmdb-controlloop';
import type { MachineRef } from '@bmaas/bmdb-model';
import { lookUpMachines } from '@bmaas/bmdb-model';
import { describeError, Semaphore } from '@bmaas/common';
import { type PowerActionKind, type PowerActionResult, PowerActions } from '@bmaas/shepherd-manager';
import { withSession } from '../database.js';
import { type Argv, actor, databaseSettings, reason, UsageError } from '../settings.js';
import { describeMachine, MachinesNotDoneError, machineTargets, unknownLines } from './machine-targets.js';
import { wirePowerControl } from './provider-wiring.js';
import { type ProviderKind, powerProviderSettings } from './run-settings.js';

/** What `shepherd power` does: read the power state, or one of the power actions. */
export type PowerCommand = 'status' | PowerActionKind;

export const POWER_COMMANDS: readonly PowerCommand[] = ['status', 'on', 'off', 'cycle'];

/** The providers whose power the shepherd controls, by their BMDB name. */
const PROVIDER_KINDS: Record<string, ProviderKind> = { dummy: 'dummy', equinix: 'equinix', static: 'static' };
const PROVIDER_NAMES = 'Dummy, Equinix or Static';

/** Machines acted on at once; each BMC request is bounded further by its provider (`--redfish-concurrency`). */
const CONCURRENCY = 8;

const DONE: Record<PowerActionKind, string> = { on: 'powered on', off: 'powered off', cycle: 'power-cycled' };

/**
 * `shepherd power status|on|off|cycle --provider P --provider-id ID…
 * [--reason TEXT]`: through the provider `run <kind>` would wire from the
 * same flags. `status` reads each machine's power state from its provider
 * and records it; `on`, `off` (`--graceful`: ask the OS) and `cycle` are
 * power actions, each a claim of its own, refused while other shepherd work
 * runs on the machine, and recorded in its history. A power off holds the
 * machine. Every machine is tried, each on its own (one's database error
 * stops no other's action); exits 1 naming each that was refused, failed
 * (with the provider's cause), whose outcome is unknown (the BMC may have
 * acted), or that the BMDB does not know.
 */
export async function power(argv: Argv, command: PowerCommand, write: (text: string) => void): Promise<void> {
  const context = `power ${command}`;
  const targets = machineTargets(argv, context, { machineIds: false });
  if (!('provider' in targets)) throw new UsageError('provider', `required for ${context}`);
  const kind = PROVIDER_KINDS[targets.provider.toLowerCase()];
  if (kind === undefined) {
    throw UsageError.invalid(
      'provider',
      targets.provider,
      `a provider whose power the shepherd controls: ${PROVIDER_NAMES}`,
    );
  }
  const why = command === 'status' ? undefined : reason(argv, context);
  const graceful = argv.graceful === true;
  if (graceful && command !== 'off') throw new UsageError('graceful', `only for power off, not ${context}`);
  const who = actor(argv);
  // Checked before the provider's own flags (the inventory is read), as `run` does.
  databaseSettings(argv);
  const settings = await powerProviderSettings(argv, kind, `${context} --provider ${targets.provider}`);
  const { power: control, close } = wirePowerControl(settings);
  try {
    await withSession(argv, 'shepherd-power', async (session, bmdb) => {
      const names = { provider: control.type, providerIds: targets.providerIds };
      const lookup = await session.transact((q) => lookUpMachines(q, names));
      const actions = new PowerActions(bmdb, control);
      const slots = new Semaphore(CONCURRENCY);
      // Each machine settles on its own: a failure (a database error) of one
      // must not end the session, and with it the others' actions mid-command.
      const lines = await Promise.all(
        lookup.found.map(async (machine): Promise<Line> => {
          const release = await slots.acquire();
          try {
            if (command === 'status') return await status(actions, session, machine);
            const request = { action: command, reason: why as string, actor: who, graceful };
            return described(command, machine, await actions.take(session, machine.machineId, request));
          } catch (error) {
            return { failed: `${describeMachine(machine)}: ${context}: ${describeError(error)}` };
          } finally {
            release();
          }
        }),
      );
      for (const line of lines) if ('done' in line) write(`${line.done}\n`);
      const failed = [
        ...lines.flatMap((line) => ('failed' in line ? [line.failed] : [])),
        ...unknownLines(names, lookup),
      ];
      if (failed.length > 0) throw new MachinesNotDoneError(`${context}: not done on`, failed);
    });
  } finally {
    await close();
  }
}

type Line = { readonly done: string } | { readonly failed: string };

async function status(actions: PowerActions, session: Session, machine: MachineRef): Promise<Line> {
  const reading = await actions.read(session, { machineId: machine.machineId, providerId: machine.providerId ?? '' });
  return 'state' in reading
    ? { done: `${describeMachine(machine)}: ${reading.state}` }
    : { failed: `${describeMachine(machine)}: power state unreadable: ${reading.failure}` };
}

function described(command: PowerActionKind, machine: MachineRef, result: PowerActionResult): Line {
  const name = describeMachine(machine);
  const held =
    'held' in result && result.held ? ' (held: a power off holds a machine; `shepherd unhold` releases it)' : '';
  switch (result.outcome) {
    case 'Succeeded':
      return { done: `${DONE[command]} ${name}: ${result.command}${held}` };
    case 'Failed':
      return { failed: `${name}: power ${command} failed: ${result.cause}${held}` };
    case 'Unknown':
      return { failed: `${name}: power ${command} outcome unknown: ${result.cause}${held}` };
    case 'Refused':
      return { failed: `${name}: power ${command} refused: ${result.cause}` };
  }
}

/** The power command named on the command line, if it is one. */
export function powerCommand(word: string | undefined): PowerCommand | undefined {
  return POWER_COMMANDS.find((command) => command === word);
}
