import {
  type BMDB,
  describeError,
  NothingToDoError,
  OperatorAction,
  OperatorOutcome,
  type PowerState,
  Process,
  type ProvidedMachine,
  Queries,
  type Session,
  type Work,
  WorkConflictError,
} from '@bmaas/bmdb-controlloop';
import { log } from './internal.js';
import type { PowerCommand, PowerControl } from './power.js';

/** What an operator asks of a machine's power. */
export type PowerActionKind = 'on' | 'off' | 'cycle';

/** An operator's power action: what, why and who. */
export interface PowerActionRequest {
  readonly action: PowerActionKind;
  /** Why (recorded with the action). */
  readonly reason: string;
  /** Who (`user@host`). */
  readonly actor: string;
  /** `off`: ask the OS to shut down rather than cut the power. */
  readonly graceful?: boolean | undefined;
}

/** How a power action ended; each is recorded in the machine's operator history. */
export type PowerActionResult =
  | {
      readonly outcome: 'Succeeded';
      /** What the provider was told (`ForceOff`, `power_off`). */
      readonly command: string;
      /** Whether this action placed a hold (a power off of a machine not held). */
      readonly held: boolean;
    }
  | { readonly outcome: 'Failed'; readonly cause: string; readonly held: boolean }
  | {
      readonly outcome: 'Refused';
      readonly cause: string;
      /** The processes whose live work kept the action out. */
      readonly busyWith: readonly string[];
    };

/** A power state read from the provider, or why it could not be read. */
export type PowerReading = { readonly state: PowerState } | { readonly failure: string };

const ACTIONS: Record<PowerActionKind, string> = {
  on: OperatorAction.PowerOn,
  off: OperatorAction.PowerOff,
  cycle: OperatorAction.PowerCycle,
};

/** Claims raced away (the machine's last work ending as we looked) before refusing for good. */
const CLAIM_ATTEMPTS = 3;

/**
 * An operator's power actions on machines, through a provider's
 * {@link PowerControl}. Each action is a claim of process
 * `ShepherdPowerAction`, exclusive with the shepherd's own processes: it is
 * refused, naming the work, while a recovery, an agent start or another
 * power action runs on the machine, and no recovery starts while it runs.
 * Held machines are acted on: holds are for working on machines. A power
 * off of a machine not held holds it first (with the action's reason), so
 * the recoverer does not power it back on; a power on does not release a
 * hold.
 *
 * Every action, whatever its outcome, lands in the machine's operator
 * history with reason, actor and outcome (and the cause of a failure or
 * refusal); a succeeded one makes the machine the power sync's next read.
 */
export class PowerActions {
  constructor(
    private readonly bmdb: BMDB,
    private readonly power: PowerControl,
  ) {}

  /**
   * Takes `request` on the provided machine `machineId` through `session`.
   * Resolves with the outcome; throws only when the BMDB cannot be written
   * (the provider may have acted then: the error says so).
   */
  async take(
    session: Session,
    machineId: string,
    request: PowerActionRequest,
    signal?: AbortSignal,
  ): Promise<PowerActionResult> {
    const action = ACTIONS[request.action];
    const claimed = await this.#claim(session, machineId);
    if ('cause' in claimed) {
      await session.transact((q) =>
        q.recordOperatorAction({
          machineId,
          action,
          outcome: OperatorOutcome.Refused,
          reason: request.reason,
          actor: request.actor,
          cause: claimed.cause,
          detail: details(request),
        }),
      );
      log.power('machine %s: %s refused: %s', machineId, action, claimed.cause);
      return { outcome: 'Refused', cause: claimed.cause, busyWith: claimed.busyWith };
    }
    const work = claimed;
    const { providerId } = work.candidate;
    let held = false;
    let result: PowerCommand | { failure: string };
    try {
      if (request.action === 'off') {
        ({ placed: held } = await session.transact((q) =>
          q.holdMachine(machineId, { reason: request.reason, actor: request.actor, detail: { impliedBy: action } }),
        ));
        if (held) log.power('machine %s (provider ID %s): held for the power off', machineId, providerId);
      }
      result = await this.#act(providerId, request, AbortSignal.any([session.signal, ...(signal ? [signal] : [])]));
    } catch (error) {
      await work.cancel();
      throw error;
    }
    const outcome: { failure: string } | PowerCommand = result;
    await work.finish(async (q) => {
      await q.recordOperatorAction({
        machineId,
        action,
        outcome: 'failure' in outcome ? OperatorOutcome.Failed : OperatorOutcome.Succeeded,
        reason: request.reason,
        actor: request.actor,
        cause: 'failure' in outcome ? outcome.failure : null,
        detail: { ...details(request), ...('command' in outcome ? { command: outcome.command } : {}) },
      });
      if ('command' in outcome) await q.forgetPowerRead(machineId);
    });
    if ('failure' in outcome) {
      log.power('machine %s (provider ID %s): %s failed: %s', machineId, providerId, action, outcome.failure);
      return { outcome: 'Failed', cause: outcome.failure, held };
    }
    log.power(
      'machine %s (provider ID %s): %s by %s (%s): %s',
      machineId,
      providerId,
      action,
      request.actor,
      request.reason,
      outcome.command,
    );
    return { outcome: 'Succeeded', command: outcome.command, held };
  }

  /**
   * Reads the machine's power state from the provider now and records it
   * (or the failure with its cause), as a power sync does. Takes no claim:
   * a read acts on nothing.
   */
  async read(session: Session, machine: Pick<ProvidedMachine, 'machineId' | 'providerId'>): Promise<PowerReading> {
    let reading: PowerReading;
    try {
      reading = { state: await this.power.readPowerState(machine.providerId, session.signal) };
    } catch (error) {
      reading = { failure: describeError(error) };
    }
    await session.transact((q) => q.recordPowerState(machine.machineId, reading));
    return reading;
  }

  async #claim(
    session: Session,
    machineId: string,
  ): Promise<Work<ProvidedMachine> | { cause: string; busyWith: readonly string[] }> {
    const selection = new Queries(this.bmdb.db).powerActionSelection(machineId);
    for (let attempt = 1; ; attempt++) {
      try {
        return await session.work(Process.ShepherdPowerAction, selection);
      } catch (error) {
        if (!(error instanceof NothingToDoError || error instanceof WorkConflictError)) throw error;
      }
      const { found } = await session.transact((q) => q.lookUpMachines({ machineIds: [machineId] }));
      const machine = found[0];
      if (machine === undefined) return { cause: 'no such machine in the BMDB', busyWith: [] };
      if (machine.provider === null) return { cause: 'the machine has no Provided tag', busyWith: [] };
      if (machine.liveWork.length > 0) {
        return {
          cause: `work is running on it (${machine.liveWork.join(', ')}); try again once it ended`,
          busyWith: machine.liveWork,
        };
      }
      if (attempt >= CLAIM_ATTEMPTS) {
        return { cause: `claimed by others ${CLAIM_ATTEMPTS} times as it was looked at; try again`, busyWith: [] };
      }
    }
  }

  async #act(
    providerId: string,
    request: PowerActionRequest,
    signal: AbortSignal,
  ): Promise<PowerCommand | { failure: string }> {
    try {
      switch (request.action) {
        case 'on':
          return await this.power.powerOn(providerId, signal);
        case 'off':
          return await this.power.powerOff(providerId, { graceful: request.graceful ?? false }, signal);
        case 'cycle':
          return await this.power.powerCycle(providerId, signal);
      }
    } catch (error) {
      if (signal.aborted) throw error;
      return { failure: describeError(error) };
    }
  }
}

function details(request: PowerActionRequest): Record<string, unknown> {
  return request.action === 'off' ? { graceful: request.graceful ?? false } : {};
}
