import {
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  describeError,
  PowerState,
  Process,
  type ProvidedMachine,
  Queries,
  type RecoveryThresholds,
  runControlLoop,
  runRounds,
  type Selection,
  type Task,
} from '@bmaas/bmdb-controlloop';
import { detail, log } from './internal.js';
import type { PowerControl } from './power.js';
import type { Provider } from './provider.js';

/**
 * A provider that can also power-cycle its machines, as the {@link Recoverer}
 * loop needs: the port is the recoverer's, so it is declared here.
 */
export interface RebootingProvider extends Provider {
  /** Reboots the machine `id`; resolves once the provider accepted the request. */
  rebootMachine(id: string, signal?: AbortSignal): Promise<void>;
}

/** Options of the {@link Recoverer}: when an agent counts as silent, and how often heartbeats are audited. */
export interface RecovererOptions extends RecoveryThresholds {
  /**
   * How often `run` looks for heartbeats stamped in the future, in
   * milliseconds (also once at start). Default 1 min.
   */
  readonly auditInterval?: number;
  /**
   * The provider's power control: each machine's power state is then read
   * before it is recovered, and a machine found `Off` is powered on instead
   * of reset (many BMCs refuse a restart of a system that is off). Without
   * it every machine is rebooted.
   */
  readonly power?: PowerControl | undefined;
}

/** A heartbeat this far ahead of the BMDB's clock is bad data, not clock jitter. */
const FUTURE_TOLERANCE_SECONDS = 60;
const DEFAULT_AUDIT_INTERVAL = 60_000;

/**
 * Reboots machines whose agent went silent (process `ShepherdRecovery`): no
 * first heartbeat 30 min after the start, or none for 10 min (both
 * configurable); with the provider's power control, a machine found `Off`
 * (read from the provider at that moment) is powered on instead. Then it
 * deletes AgentStarted and AgentHeartbeat, so the initializer starts the
 * agent again. Failures back off 1 min → 1 h × 1.2. Held machines are left
 * alone: the selection leaves them out; so are installed ones (their agent
 * tags went with the report) and, while they show life within
 * `installingHeartbeatWithin` (1 h), machines installing.
 *
 * A heartbeat stamped in the future (a writer's clock ahead, or bad data)
 * makes its agent look alive until then, however silent it is: `run` logs
 * each such machine once, so an operator can fix what writes the heartbeats.
 * It does not reboot them: the agent may well be alive.
 */
export class Recoverer implements ControlLoop<ProvidedMachine> {
  readonly process = Process.ShepherdRecovery;
  readonly processor = 'shepherd-recoverer';
  readonly defaultBackoff: Backoff = { initial: 60_000, maximum: 3_600_000, exponent: 1.2 };
  readonly #thresholds: RecoveryThresholds;
  readonly #auditInterval: number;
  readonly #power: PowerControl | undefined;
  /** `machine/heartbeat time` pairs already logged, so each is named once. */
  #reported = new Set<string>();

  constructor(
    private readonly provider: RebootingProvider,
    options: RecovererOptions = {},
  ) {
    const { auditInterval, power, ...thresholds } = options;
    this.#thresholds = thresholds;
    this.#power = power;
    this.#auditInterval = auditInterval ?? DEFAULT_AUDIT_INTERVAL;
    if (!(this.#auditInterval > 0))
      throw new RangeError(`recoverer audit interval must be > 0, got ${auditInterval}ms`);
  }

  /** Runs the recoverer until `options.signal` aborts (see `runControlLoop`), auditing heartbeats meanwhile. */
  async run(bmdb: BMDB, options: ControlLoopOptions): Promise<void> {
    await Promise.all([
      runControlLoop(bmdb, this, options),
      this.#auditLoop(bmdb, options.signal ?? new AbortController().signal),
    ]);
  }

  /** Claimed from in one statement; parallel workers skip each other's machines. */
  selectMachines(q: Queries): Selection<ProvidedMachine> {
    return q.agentRecoverySelection({ provider: this.provider.type, ...this.#thresholds });
  }

  /**
   * Logs every machine of the provider whose last heartbeat is more than a
   * minute ahead of the BMDB's clock, once per machine and heartbeat time;
   * returns how many there are. An index range scan
   * (`machine_agent_heartbeat_at_idx`).
   */
  async auditHeartbeats(bmdb: BMDB): Promise<number> {
    const { now, heartbeats } = await new Queries(bmdb.db).agentHeartbeatsAhead({
      provider: this.provider.type,
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
      const { command } = await (this.#power as PowerControl).powerOn(providerId, task.signal);
      await task.work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
      log.recoverer(
        'powered on machine %s (provider ID %s), found off with its agent silent (%s); agent to be started again',
        machineId,
        providerId,
        command,
      );
      return;
    }
    detail.recoverer('rebooting machine %s (provider ID %s): agent silent', machineId, providerId);
    await this.provider.rebootMachine(providerId, task.signal);
    // Rebooted; the library records it through a brief database outage, in
    // one statement shared with other workers' finishes.
    await task.work.finish({ delete: ['agentStarted', 'agentHeartbeat'] });
    log.recoverer(
      'rebooted machine %s (provider ID %s), its agent silent; agent to be started again',
      machineId,
      providerId,
    );
  }

  /**
   * The machine's power state, read from the provider now (the recorded one
   * may be a minute old); `undefined` without power control or when the
   * read fails: the reboot is tried then, and fails on its own if it must.
   */
  async #powerState(task: Task<ProvidedMachine>): Promise<PowerState | undefined> {
    if (this.#power === undefined) return undefined;
    try {
      return await this.#power.readPowerState(task.candidate.providerId, task.signal);
    } catch (error) {
      if (task.signal.aborted) throw error;
      detail.recoverer(
        'machine %s (provider ID %s): power state unreadable (%s); rebooting',
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
