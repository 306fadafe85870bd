import type { Database } from '@bmaas/bmdb-controlloop';
import {
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  runControlLoop,
  runRounds,
  type Selection,
  type Task,
} from '@bmaas/bmdb-controlloop';
import {
  agentHeartbeatsAhead,
  agentRecoverySelection,
  PowerState,
  Process,
  type ProvidedMachine,
  type RecoveryThresholds,
} from '@bmaas/bmdb-model';
import { describeError, sleep } from '@bmaas/common';
import type { Kysely } from 'kysely';
import { detail, log } from './internal.js';
import type { PowerControl } from './power.js';

/** Options of the {@link Recoverer}: when an agent counts as silent, and how often heartbeats are audited. */
export interface RecovererOptions extends RecoveryThresholds {
  /**
   * How often `run` looks for heartbeats stamped in the future, in
   * milliseconds (also once at start). Default 1 min.
   */
  readonly auditInterval?: number;
  /**
   * How long to wait after the provider accepted a power cycle before the
   * machine counts as recovered (its agent tags deleted), in milliseconds:
   * so the initializer does not start the agent on the OS going down
   * (`--equinix-reboot-wait`, `--static-reboot-wait`). Default 0.
   */
  readonly powerCycleWait?: number | undefined;
}

/** A heartbeat this far ahead of the BMDB's clock is bad data, not clock jitter. */
const FUTURE_TOLERANCE_SECONDS = 60;
const DEFAULT_AUDIT_INTERVAL = 60_000;

/**
 * Power-cycles machines whose agent went silent (process `ShepherdRecovery`),
 * through the provider's {@link PowerControl}: no first heartbeat 30 min
 * after the start, or none for 10 min (both configurable). The machine's
 * power state is read from the provider first, and a machine found `Off` is
 * powered on instead (many BMCs refuse a restart of a system that is off). Then it
 * deletes AgentStarted and AgentHeartbeat, so the initializer starts the
 * agent again. Failures back off 1 min → 1 h × 1.2. Held machines are left
 * alone: the selection leaves them out; so are installed ones (their agent
 * tags went with the report) and, while they show life within
 * `installingHeartbeatWithin` (1 h), machines installing.
 *
 * A heartbeat stamped in the future (a writer's clock ahead, or bad data)
 * makes its agent look alive until then, however silent it is: `run` logs
 * each such machine once, so an operator can fix what writes the heartbeats.
 * It does not power-cycle them: the agent may well be alive.
 */
export class Recoverer implements ControlLoop<ProvidedMachine> {
  readonly process = Process.ShepherdRecovery;
  readonly processor = 'shepherd-recoverer';
  readonly defaultBackoff: Backoff = { initial: 60_000, maximum: 3_600_000, exponent: 1.2 };
  readonly #thresholds: RecoveryThresholds;
  readonly #auditInterval: number;
  readonly #powerCycleWait: number;
  /** `machine/heartbeat time` pairs already logged, so each is named once. */
  #reported = new Set<string>();

  /** `power` is the provider's power control; its `type` names the provider whose machines are recovered. */
  constructor(
    private readonly power: PowerControl,
    options: RecovererOptions = {},
  ) {
    const { auditInterval, powerCycleWait, ...thresholds } = options;
    this.#thresholds = thresholds;
    this.#auditInterval = auditInterval ?? DEFAULT_AUDIT_INTERVAL;
    if (!(this.#auditInterval > 0))
      throw new RangeError(`recoverer audit interval must be > 0, got ${auditInterval}ms`);
    this.#powerCycleWait = powerCycleWait ?? 0;
    if (!(this.#powerCycleWait >= 0))
      throw new RangeError(`recoverer power cycle wait must be >= 0 ms, got ${powerCycleWait}ms`);
  }

  /** Runs the recoverer until `options.signal` aborts (see `runControlLoop`), auditing heartbeats meanwhile. */
  async run(bmdb: BMDB, options: ControlLoopOptions): Promise<void> {
    await Promise.all([
      runControlLoop(bmdb, this, options),
      this.#auditLoop(bmdb, options.signal ?? new AbortController().signal),
    ]);
  }

  /** Claimed from in one statement; parallel workers skip each other's machines. */
  selectMachines(q: Kysely<Database>): Selection<ProvidedMachine> {
    return agentRecoverySelection(q, { provider: this.power.type, ...this.#thresholds });
  }

  /**
   * Logs every machine of the provider whose last heartbeat is more than a
   * minute ahead of the BMDB's clock, once per machine and heartbeat time;
   * returns how many there are. An index range scan
   * (`machine_agent_heartbeat_at_idx`).
   */
  async auditHeartbeats(bmdb: BMDB): Promise<number> {
    const { now, heartbeats } = await agentHeartbeatsAhead(bmdb.db, {
      provider: this.power.type,
      toleranceSeconds: FUTURE_TOLERANCE_SECONDS,
    });
    const seen = new Set<string>();
    for (const heartbeat of heartbeats) {
      const key = `${heartbeat.machineId}/${heartbeat.heartbeatAt.toISOString()}`;
      seen.add(key);
      if (this.#reported.has(key)) continue;
      log.recoverer(
        'machine %s (provider ID %s): agent heartbeat at %s is %s in the future by the BMDB clock; until then its ' +
          'agent counts as alive, however silent (check the clock of what records heartbeats)',
        heartbeat.machineId,
        heartbeat.providerId,
        heartbeat.heartbeatAt.toISOString(),
        aheadBy((heartbeat.heartbeatAt.getTime() - now.getTime()) / 1000),
      );
    }
    this.#reported = seen;
    return heartbeats.length;
  }

  #auditLoop(bmdb: BMDB, signal: AbortSignal): Promise<void> {
    return runRounds(
      {
        signal,
        interval: this.#auditInterval,
        onFailure: (error) => log.recoverer('auditing heartbeats failed: %s', describeError(error)),
      },
      () => this.auditHeartbeats(bmdb),
    );
  }

  async processMachine(task: Task<ProvidedMachine>): Promise<void> {
    const { machineId, providerId } = task.candidate;
    if ((await this.#powerState(task)) === PowerState.Off) {
      detail.recoverer('powering on machine %s (provider ID %s): agent silent, machine off', machineId, providerId);
      const { command } = await this.power.powerOn(providerId, task.signal);
      await task.work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
      log.recoverer(
        'powered on machine %s (provider ID %s), found off with its agent silent (%s); agent to be started again',
        machineId,
        providerId,
        command,
      );
      return;
    }
    detail.recoverer('power-cycling machine %s (provider ID %s): agent silent', machineId, providerId);
    const { command } = await this.power.powerCycle(providerId, task.signal);
    if (this.#powerCycleWait > 0) {
      detail.recoverer(
        'machine %s (provider ID %s): %s accepted; waiting %dms for the OS to go down',
        machineId,
        providerId,
        command,
        this.#powerCycleWait,
      );
      await sleep(this.#powerCycleWait, task.signal);
    }
    // Power-cycled; the library records it through a brief database outage,
    // in one statement shared with other workers' finishes.
    await task.work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
    log.recoverer(
      'power-cycled machine %s (provider ID %s), its agent silent (%s); agent to be started again',
      machineId,
      providerId,
      command,
    );
  }

  /**
   * The machine's power state, read from the provider now (the recorded one
   * may be a minute old); `undefined` when the read fails: the power cycle
   * is tried then, and fails on its own if it must.
   */
  async #powerState(task: Task<ProvidedMachine>): Promise<PowerState | undefined> {
    try {
      return await this.power.readPowerState(task.candidate.providerId, task.signal);
    } catch (error) {
      if (task.signal.aborted) throw error;
      detail.recoverer(
        'machine %s (provider ID %s): power state unreadable (%s); power-cycling',
        task.candidate.machineId,
        task.candidate.providerId,
        describeError(error),
      );
      return undefined;
    }
  }
}

function aheadBy(seconds: number): string {
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 2 * 86_400) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86_400)} days`;
}
