import type { Database } from '@bmaas/bmdb-controlloop';
import {
  agentBootSelection,
  agentEnrollment,
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  issueEnrollmentToken,
  needsAgentBoot,
  Process,
  type ProvidedMachine,
  type RecoveryThresholds,
  runControlLoop,
  type Selection,
  type Task,
} from '@bmaas/bmdb-controlloop';
import { describeError, sleep } from '@bmaas/common';
import { create } from '@bufbuild/protobuf';
import type { Kysely } from 'kysely';
import type { AgentBootControl, AgentBootStarted } from './agent-boot.js';
import type { AgentBootFiles } from './agent-boot-files.js';
import { TakeoverInitSchema } from './gen/cloud/agent/api/takeover_pb.js';
import { detail, log } from './internal.js';
import { type Provider, ShepherdError } from './provider.js';

/** What the {@link AgentBooter} tells the agents it boots, and how long it waits for them. */
export interface AgentBooterOptions extends RecoveryThresholds {
  /** Address of the BMaaS endpoint the agent enrolls with and heartbeats to (`TakeoverInit.bmaas_endpoint`). */
  readonly agentEndpoint: string;
  /** DER X.509 CA certificate of the endpoint; absent, the agent trusts its system CAs. */
  readonly agentEndpointCaCertificate?: Uint8Array | undefined;
  /**
   * How long a booted agent has to enroll, in milliseconds, from the BMC's
   * acceptance of the boot: the firmware's POST, fetching the ISO or the
   * kernel and initramfs, the image's start. Default 10 min.
   */
  readonly enrollmentWithin?: number;
  /** How often the enrollment is looked for while waiting, in milliseconds. Default 2 s. */
  readonly enrollmentPollInterval?: number;
}

const DEFAULT_ENROLLMENT_WITHIN = 10 * 60_000;
/** The agent's own heartbeat interval, which a booted agent keeps unless the thresholds want it shorter. */
const AGENT_INTERVAL = 30_000;
/** Heartbeats an agent sends within the recoverer's heartbeat threshold, so that one late never makes it "silent". */
const HEARTBEATS_PER_THRESHOLD = 3;
const DEFAULT_ENROLLMENT_POLL_INTERVAL = 2_000;
/** The token outlives the wait by this much, so an agent enrolling at the wait's last moment is not refused. */
const TOKEN_GRACE_SECONDS = 60;

/**
 * A booted agent did not enroll within the bound: the BMC ignored its boot
 * override, the firmware found no DHCP answer or could not fetch the image,
 * or the agent could not reach the server. Names the machine and how it was
 * booted; the work fails and backs off.
 */
export class AgentEnrollmentTimeoutError extends ShepherdError {
  override name = 'AgentEnrollmentTimeoutError';
  constructor(
    readonly machineId: string,
    readonly providerId: string,
    readonly boot: AgentBootStarted,
    readonly waitedMs: number,
  ) {
    super(
      `machine ${machineId} (provider ID ${providerId}): no enrollment ${Math.round(waitedMs / 1000)} s after its ${boot.method} boot (${boot.detail}): check the machine's console for a boot override the BMC ignored, a failed image download or no DHCP answer`,
    );
  }
}

/**
 * Boots the agent through the machine's BMC (process `ShepherdAgentBoot`),
 * for the machines whose inventory says their BMC does (`virtual-media`,
 * `network`) and which need an agent: none started yet, an installed machine
 * asked to install again or to wipe, or an agent silent past the recoverer's
 * thresholds (booted into the agent again, rather than power-cycled forever).
 *
 * For each, once it checked the claimed machine still needs it
 * (`needsAgentBoot`; else the work is canceled, the machine left as it is):
 * a one-time enrollment token, this boot's files holding it
 * ({@link AgentBootFiles}), the BMC's boot ({@link AgentBootControl.bootAgent}),
 * then the wait for the agent's enrollment, which records AgentStarted as a
 * takeover would. The media is ejected and the boot's files removed however
 * the wait ended. A boot whose agent did not enroll within the bound fails
 * with {@link AgentEnrollmentTimeoutError}; failures back off 5 min → 4 h × 1.5.
 */
export class AgentBooter implements ControlLoop<ProvidedMachine> {
  readonly process = Process.ShepherdAgentBoot;
  readonly processor = 'shepherd-agent-booter';
  readonly defaultBackoff: Backoff = { initial: 5 * 60_000, maximum: 4 * 3_600_000, exponent: 1.5 };
  readonly #thresholds: RecoveryThresholds;
  readonly #enrollmentWithin: number;
  readonly #pollInterval: number;
  /** What the booted agents are started with: a heartbeat interval their silence threshold allows. */
  readonly #agentFlags: readonly string[];
  /** The BMDB `run` was given: where tokens are issued and enrollments looked for. */
  #bmdb: BMDB | undefined;

  constructor(
    private readonly provider: Provider & AgentBootControl,
    private readonly files: AgentBootFiles,
    private readonly options: AgentBooterOptions,
  ) {
    if (!options.agentEndpoint) throw new RangeError('agent booter: the agent endpoint must be set');
    const { firstHeartbeatWithin, heartbeatWithin, installingHeartbeatWithin } = options;
    this.#thresholds = { firstHeartbeatWithin, heartbeatWithin, installingHeartbeatWithin };
    this.#enrollmentWithin = positive(options.enrollmentWithin ?? DEFAULT_ENROLLMENT_WITHIN, 'enrollment bound');
    this.#pollInterval = positive(
      options.enrollmentPollInterval ?? DEFAULT_ENROLLMENT_POLL_INTERVAL,
      'enrollment poll interval',
    );
    this.#agentFlags = agentFlags(heartbeatWithin);
  }

  /** Runs the loop until `options.signal` aborts (see `runControlLoop`). */
  run(bmdb: BMDB, options: ControlLoopOptions): Promise<void> {
    this.#bmdb = bmdb;
    return runControlLoop(bmdb, this, options);
  }

  /** Claimed from in one statement; parallel workers skip each other's machines. */
  selectMachines(q: Kysely<Database>): Selection<ProvidedMachine> {
    return agentBootSelection(q, { provider: this.provider.type, ...this.#thresholds });
  }

  async processMachine(task: Task<ProvidedMachine>): Promise<void> {
    const { machineId, providerId } = task.candidate;
    const db = this.#db();
    const machine = await this.provider.getMachine(providerId, task.signal);
    // Checked again now that the claim holds it, last before the token and the reset: a heartbeat whose statement
    // began before the claim committed may have settled its installation (the OS runs) or shown its agent alive,
    // or the reinstall was canceled. Heartbeats after the claim store no report and hand out no request.
    if (!(await needsAgentBoot(db, machineId, { provider: this.provider.type, ...this.#thresholds }))) {
      log.agentBooter('machine %s (provider ID %s) needs no agent boot any more: not booted', machineId, providerId);
      await task.work.cancel();
      return;
    }
    const token = await issueEnrollmentToken(db, machineId, {
      validForSeconds: Math.ceil(this.#enrollmentWithin / 1000) + TOKEN_GRACE_SECONDS,
    });
    const init = create(TakeoverInitSchema, {
      machineId,
      bmaasEndpoint: this.options.agentEndpoint,
      ...(this.options.agentEndpointCaCertificate ? { caCertificate: this.options.agentEndpointCaCertificate } : {}),
    });
    const files = await this.files.prepare({
      machineId,
      macs: machine.macs,
      init,
      token: token.token,
      flags: this.#agentFlags,
    });
    try {
      const started = await this.provider.bootAgent(providerId, { isoUrl: files.isoUrl }, task.signal);
      log.agentBooter('booting the agent on machine %s (provider ID %s): %s', machineId, providerId, started.detail);
      await this.#waitForEnrollment(db, task, started, token.expiresAt);
      log.agentBooter('agent enrolled on machine %s (provider ID %s)', machineId, providerId);
    } finally {
      await this.files.forget(machineId);
      await this.#endBoot(machineId, providerId);
    }
    // The enrollment recorded AgentStarted; the claim only has to end.
    await task.work.finish();
  }

  async #waitForEnrollment(
    db: Kysely<Database>,
    task: Task<ProvidedMachine>,
    started: AgentBootStarted,
    expiresAt: Date,
  ): Promise<void> {
    const { machineId, providerId } = task.candidate;
    const since = Date.now();
    for (;;) {
      const enrollment = await agentEnrollment(db, machineId);
      // Only a claim holder issues a token, so the machine's row is this boot's unless the claim was lost
      // and another boot issued one since: its expiry, this token's own, tells the two apart.
      if (enrollment?.enrolledAt !== undefined && enrollment.expiresAt.getTime() === expiresAt.getTime()) return;
      const waited = Date.now() - since;
      if (waited >= this.#enrollmentWithin) {
        throw new AgentEnrollmentTimeoutError(machineId, providerId, started, waited);
      }
      detail.agentBooter('machine %s: no enrollment yet after %d ms', machineId, waited);
      await sleep(Math.min(this.#pollInterval, this.#enrollmentWithin - waited), task.signal);
    }
  }

  #db(): Kysely<Database> {
    if (this.#bmdb === undefined) throw new Error('agent booter: processMachine before run');
    return this.#bmdb.db;
  }

  /** Ejects the media; a BMC that refuses is logged, not failed on: the agent enrolled, or the work fails anyway. */
  async #endBoot(machineId: string, providerId: string): Promise<void> {
    try {
      await this.provider.endAgentBoot(providerId);
    } catch (error) {
      log.agentBooter(
        'ending the agent boot of machine %s (provider ID %s) failed: %s',
        machineId,
        providerId,
        describeError(error),
      );
    }
  }
}

/**
 * A booted agent's flags: its heartbeat interval, a third of the recoverer's
 * heartbeat threshold where that is under the agent's own 30 s (the agent
 * booter takes a BMC-booted machine whose agent is silent past it, and would
 * boot a working agent again). The SSH takeover's agents get theirs from the
 * image they are built into.
 */
function agentFlags(heartbeatWithin: number | undefined): readonly string[] {
  if (heartbeatWithin === undefined) return [];
  const interval = Math.floor(heartbeatWithin / HEARTBEATS_PER_THRESHOLD);
  return interval < AGENT_INTERVAL ? [`--interval=${Math.max(interval, 100)}ms`] : [];
}

function positive(ms: number, what: string): number {
  if (!(ms > 0) || !Number.isFinite(ms)) throw new RangeError(`agent booter: ${what} must be > 0, got ${ms}ms`);
  return ms;
}
