import { type BMDB, NothingToDoError, type Session, type Work, WorkConflictError } from '@bmaas/bmdb-controlloop';
import {
  forgetPowerRead,
  holdMachine,
  leasePowerRead,
  lookUpMachines,
  OperatorAction,
  OperatorOutcome,
  type PowerState,
  Process,
  type ProvidedMachine,
  powerActionSelection,
  recordOperatorAction,
  recordPowerRead,
} from '@bmaas/bmdb-model';
import { describeError } from '@bmaas/common';
import { log } from './internal.js';
import { type AcceptedPowerCommand, type PowerControl, PowerOutcomeUnknownError } from './power.js';
import { ShepherdError } from './provider.js';

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
      /**
       * The provider may have acted: the BMC did not answer a power cycle,
       * or the action was cut short (its session ended, the caller stopped
       * it) once the BMC was asked. Recorded as `Failed`, with
       * `mayHaveActed` in the detail; the power sync reads the machine next.
       */
      readonly outcome: 'Unknown';
      readonly cause: string;
      readonly held: boolean;
    }
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

/**
 * A power action was taken but its outcome could not be recorded (the BMDB
 * refused the write, or could not be reached): the provider may have acted.
 * Names the machine, the action and what the provider answered.
 */
export class PowerActionNotRecordedError extends ShepherdError {
  override name = 'PowerActionNotRecordedError';
  constructor(
    readonly machineId: string,
    readonly action: string,
    /** What the provider answered: its command, or why it failed. */
    readonly answer: string,
    cause: unknown,
  ) {
    super(
      `machine ${machineId}: ${action} (${answer}) could not be recorded: ${describeError(cause)}; the provider may have acted`,
      { cause },
    );
  }
}

/** What the provider answered an action: the command it took, why it failed, or why its outcome is unknown. */
type Answer = AcceptedPowerCommand | { readonly failure: string } | { readonly unknown: string };

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
 * refusal); one that may have acted (succeeded, or its outcome unknown)
 * makes the machine the power sync's next read. Each action settles on its
 * own: one machine's failure stops no other.
 */
export class PowerActions {
  constructor(
    private readonly bmdb: BMDB,
    private readonly power: PowerControl,
  ) {}

  /**
   * Takes `request` on the provided machine `machineId` through `session`.
   * Resolves with the outcome, `Unknown` when the provider may have acted
   * without saying so: it did not answer a power cycle, or `signal` or the
   * session's end cut the action short once the provider was asked (recorded
   * all the same, without the session if it is gone).
   *
   * @throws {@link PowerActionNotRecordedError} when the outcome cannot be recorded (the provider may have acted)
   * @throws the BMDB's error when the claim, its refusal or the hold of a power off cannot be written (nothing was asked)
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
        recordOperatorAction(q, {
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
    const stop = AbortSignal.any([session.signal, ...(signal ? [signal] : [])]);
    let held = false;
    let answer: Answer;
    try {
      if (request.action === 'off') {
        ({ placed: held } = await session.transact((q) =>
          holdMachine(q, machineId, { reason: request.reason, actor: request.actor, detail: { impliedBy: action } }),
        ));
        if (held) log.power('machine %s (provider ID %s): held for the power off', machineId, providerId);
      }
      answer = await this.#act(providerId, request, stop);
    } catch (error) {
      await work.cancel();
      throw error;
    }
    const entry = {
      machineId,
      action,
      outcome: 'command' in answer ? OperatorOutcome.Succeeded : OperatorOutcome.Failed,
      reason: request.reason,
      actor: request.actor,
      cause: 'failure' in answer ? answer.failure : 'unknown' in answer ? answer.unknown : null,
      detail: {
        ...details(request),
        ...('command' in answer ? { command: answer.command } : {}),
        ...('unknown' in answer ? { mayHaveActed: true } : {}),
      },
    };
    try {
      if (stop.aborted) {
        // The session may be gone with the claim: the outcome is recorded without it.
        await work.cancel().catch((error: unknown) => {
          log.power('machine %s: claim not canceled (%s); it ends with its session', machineId, describeError(error));
        });
        const q = this.bmdb.db;
        await recordOperatorAction(q, entry);
        await forgetPowerRead(q, machineId);
      } else {
        await work.finish(async (q) => {
          await recordOperatorAction(q, entry);
          if (!('failure' in answer)) await forgetPowerRead(q, machineId);
        });
      }
    } catch (error) {
      await work.cancel().catch(() => undefined);
      const said = 'command' in answer ? answer.command : 'failure' in answer ? answer.failure : answer.unknown;
      throw new PowerActionNotRecordedError(machineId, action, said, error);
    }
    if ('failure' in answer) {
      log.power('machine %s (provider ID %s): %s failed: %s', machineId, providerId, action, answer.failure);
      return { outcome: 'Failed', cause: answer.failure, held };
    }
    if ('unknown' in answer) {
      log.power('machine %s (provider ID %s): %s outcome unknown: %s', machineId, providerId, action, answer.unknown);
      return { outcome: 'Unknown', cause: answer.unknown, held };
    }
    log.power(
      'machine %s (provider ID %s): %s by %s (%s): %s',
      machineId,
      providerId,
      action,
      request.actor,
      request.reason,
      answer.command,
    );
    return { outcome: 'Succeeded', command: answer.command, held };
  }

  /**
   * Reads the machine's power state from the provider now and records it
   * (or the failure with its cause), as a power sync does: leased first, so
   * a power action or another read that came while the BMC answered keeps
   * its newer state (this one is then not recorded). Takes no claim: a read
   * acts on nothing.
   */
  async read(session: Session, machine: Pick<ProvidedMachine, 'machineId' | 'providerId'>): Promise<PowerReading> {
    const lease = await session.transact((q) => leasePowerRead(q, machine.machineId));
    let reading: PowerReading;
    try {
      reading = { state: await this.power.readPowerState(machine.providerId, session.signal) };
    } catch (error) {
      reading = { failure: describeError(error) };
    }
    if (lease !== undefined && (await session.transact((q) => recordPowerRead(q, lease, reading))) === undefined) {
      log.power('machine %s: power read overtaken by a newer one or a power action; not recorded', machine.machineId);
    }
    return reading;
  }

  async #claim(
    session: Session,
    machineId: string,
  ): Promise<Work<ProvidedMachine> | { cause: string; busyWith: readonly string[] }> {
    const selection = powerActionSelection(this.bmdb.db, machineId);
    for (let attempt = 1; ; attempt++) {
      try {
        return await session.work(Process.ShepherdPowerAction, selection);
      } catch (error) {
        if (!(error instanceof NothingToDoError || error instanceof WorkConflictError)) throw error;
      }
      const { found } = await session.transact((q) => lookUpMachines(q, { machineIds: [machineId] }));
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

  /**
   * Asks the provider; its refusal or failure is an answer. Stopped (by
   * `stop`) once the provider was asked, or told by the provider that its
   * answer did not come, the outcome is unknown: the provider may have acted.
   */
  async #act(providerId: string, request: PowerActionRequest, stop: AbortSignal): Promise<Answer> {
    try {
      switch (request.action) {
        case 'on':
          return await this.power.powerOn(providerId, stop);
        case 'off':
          return await this.power.powerOff(providerId, { graceful: request.graceful ?? false }, stop);
        case 'cycle':
          return await this.power.powerCycle(providerId, stop);
      }
    } catch (error) {
      if (stop.aborted) {
        return {
          unknown: `cut short (${describeError(stop.reason)}) once the provider was asked: it may have acted; read the power state before trying again`,
        };
      }
      if (error instanceof PowerOutcomeUnknownError) return { unknown: error.message };
      return { failure: describeError(error) };
    }
  }
}

function details(request: PowerActionRequest): Record<string, unknown> {
  return request.action === 'off' ? { graceful: request.graceful ?? false } : {};
}
