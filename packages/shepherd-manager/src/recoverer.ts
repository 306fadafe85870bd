import {
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  Process,
  type ProvidedMachine,
  type Queries,
  type RecoveryThresholds,
  runControlLoop,
  type Task,
} from '@bmaas/bmdb-controlloop';
import { finishDone, log } from './internal.js';
import type { RebootingProvider } from './provider.js';

/**
 * Reboots machines whose agent went silent (process `ShepherdRecovery`): no
 * first heartbeat 30 min after the start, or none for 10 min (both
 * configurable). After the reboot it deletes AgentStarted and AgentHeartbeat,
 * so the initializer starts the agent again. Failures back off 1 min → 1 h × 1.2.
 */
export class Recoverer implements ControlLoop<ProvidedMachine> {
  readonly process = Process.ShepherdRecovery;
  readonly processor = 'shepherd-recoverer';
  readonly defaultBackoff: Backoff = { initial: 60_000, maximum: 3_600_000, exponent: 1.2 };

  constructor(
    private readonly provider: RebootingProvider,
    private readonly thresholds: RecoveryThresholds = {},
  ) {}

  /** Runs the recoverer until `options.signal` aborts (see `runControlLoop`). */
  run(bmdb: BMDB, options: ControlLoopOptions): Promise<void> {
    return runControlLoop(bmdb, this, options);
  }

  getMachines(q: Queries, limit: number): Promise<ProvidedMachine[]> {
    return q.machinesForAgentRecovery({ provider: this.provider.type, limit, ...this.thresholds });
  }

  async processMachine(task: Task<ProvidedMachine>): Promise<void> {
    const { machineId, providerId } = task.machine;
    log.recoverer('rebooting machine %s (provider ID %s): agent silent', machineId, providerId);
    await this.provider.rebootMachine(providerId, task.signal);
    // Rebooted: a database outage must not make us reboot it again.
    await finishDone(
      task,
      async (q) => {
        await q.deleteAgentStarted(machineId);
        await q.deleteAgentHeartbeat(machineId);
      },
      log.recoverer,
    );
    log.recoverer('rebooted machine %s (provider ID %s); agent to be started again', machineId, providerId);
  }
}
