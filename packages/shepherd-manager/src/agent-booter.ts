import { randomUUID } from 'node:crypto';
import { type TakeoverInit, TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import type { Database } from '@bmaas/bmdb-controlloop';
import {
  type Backoff,
  type BMDB,
  type ControlLoop,
  type ControlLoopOptions,
  runControlLoop,
  type Selection,
  type Task,
} from '@bmaas/bmdb-controlloop';
import {
  agentBootSelection,
  agentEnrollment,
  armNetworkBoot,
  endNetworkBoot,
  issueEnrollmentToken,
  needsAgentBoot,
  networkBootState,
  Process,
  type ProvidedMachine,
  type RecoveryThresholds,
  renewEnrollmentToken,
  revokeEnrollmentToken,
} from '@bmaas/bmdb-model';
import { describeError, sleep } from '@bmaas/common';
import { create, toBinary } from '@bufbuild/protobuf';
import type { Kysely } from 'kysely';
import type { AgentBootControl, AgentBootEnd, AgentBootStarted } from './agent-boot.js';
import { type AgentBootFiles, newCapability, type PreparedAgentBoot } from './agent-boot-files.js';
import { normalizeMac } from './boot-files/ipxe.js';
import { detail, log } from './internal.js';
import { PowerOutcomeUnknownError } from './power.js';
import { type Machine, type Provider, ShepherdError } from './provider.js';

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
    /** The last look for the enrollment, when it failed (the BMDB unreachable): its cause. */
    lastPollFailure?: unknown,
  ) {
    super(
      `machine ${machineId} (provider ID ${providerId}): no enrollment ${Math.round(waitedMs / 1000)} s after its ${boot.method} boot (${boot.detail}): check the machine's console for a boot override the BMC ignored, a failed image download or no DHCP answer${lastPollFailure === undefined ? '' : `; the last look for it failed: ${describeError(lastPollFailure)}`}`,
      lastPollFailure === undefined ? undefined : { cause: lastPollFailure },
    );
  }
}

/**
 * A network boot's config was fetched a second time while the boot waited:
 * whoever fetched it first (the machine, or someone on the boot network who
 * knew its MAC) had the token, so the boot fails rather than trust an
 * enrollment. Names the machine and both fetchers; the fetch is in the
 * machine's operator history (`ServeBootConfig`, `Refused`).
 */
export class AgentBootConfigRefetchedError extends ShepherdError {
  override name = 'AgentBootConfigRefetchedError';
  constructor(
    readonly machineId: string,
    readonly providerId: string,
    /** Who was served the config. */
    readonly servedTo: string | undefined,
    /** Who fetched it again. */
    readonly refetchedBy: string | undefined,
  ) {
    super(
      `machine ${machineId} (provider ID ${providerId}): the config of its network boot was fetched again, by ${refetchedBy ?? 'an unknown address'}, after it was served to ${servedTo ?? 'an unknown address'}: the boot fails, and its token is revoked; if ${servedTo ?? 'the first'} is not the machine, someone on the boot network fetched its boot first`,
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
 * Each boot has an ID and first checks that the claimed machine still needs
 * it (`needsAgentBoot`; else the work is canceled, the machine left as it
 * is). A virtual media boot gets a one-time enrollment token and this
 * boot's ISO holding it ({@link AgentBootFiles.prepare}); a network
 * boot is armed in the BMDB (`armNetworkBoot`), so that any process's boot
 * files answer its script by MAC and serve its config once, minting its
 * token then. Then the BMC's boot ({@link AgentBootControl.bootAgent}), the
 * token made good for the bound from then, and the wait for the agent's
 * enrollment, which records AgentStarted as a takeover would. However the
 * wait ended, this boot (and no other) is cleaned up: its unused token
 * revoked, its network boot ended, its ISO forgotten, its image ejected. A
 * boot whose agent did not enroll within the bound fails with
 * {@link AgentEnrollmentTimeoutError}, one whose config was fetched twice
 * with {@link AgentBootConfigRefetchedError}; failures back off
 * 5 min → 4 h × 1.5.
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
    const boot: BootUnderWay = {
      machineId,
      providerId,
      bootId: randomUUID(),
      asked: machine.agentBoot === 'network' ? 'network' : 'virtual-media',
      media: undefined,
      networkArmed: false,
      started: undefined,
    };
    const init = create(TakeoverInitSchema, {
      machineId,
      bmaasEndpoint: this.options.agentEndpoint,
      ...(this.options.agentEndpointCaCertificate ? { caCertificate: this.options.agentEndpointCaCertificate } : {}),
    });
    try {
      if (boot.asked === 'network') await this.#armNetworkBoot(db, boot, machine, init);
      else {
        const token = await issueEnrollmentToken(db, machineId, {
          validForSeconds: this.#tokenValidForSeconds(),
          bootId: boot.bootId,
        });
        boot.media = await this.files.prepare({ machineId, init, token: token.token, flags: this.#agentFlags });
      }
      boot.started = await this.#bootAgent(boot, task.signal);
      log.agentBooter(
        'booting the agent on machine %s (provider ID %s): %s',
        machineId,
        providerId,
        boot.started.detail,
      );
      // A BMC without virtual media fell back to a network boot: armed now, before the firmware's PXE asks.
      if (boot.started.method === 'network' && !boot.networkArmed) await this.#armNetworkBoot(db, boot, machine, init);
      // The wait starts now, however long the BMC took: the token is good for it from now too.
      if (boot.started.method === 'virtual-media') await this.#renewToken(db, boot);
      await this.#waitForEnrollment(db, task, boot, boot.started);
      log.agentBooter('agent enrolled on machine %s (provider ID %s)', machineId, providerId);
    } finally {
      await this.#endBoot(db, boot);
    }
    // The enrollment recorded AgentStarted; the claim only has to end.
    await task.work.finish();
  }

  /**
   * Asks the BMC to boot the agent. A power request whose outcome is unknown
   * (sent, unanswered) may have restarted the machine into this boot: it is
   * waited for as one started, not ended at once with its media ejected.
   */
  async #bootAgent(boot: BootUnderWay, signal: AbortSignal): Promise<AgentBootStarted> {
    try {
      return await this.provider.bootAgent(boot.providerId, { isoUrl: boot.media?.isoUrl }, signal);
    } catch (error) {
      if (!(error instanceof PowerOutcomeUnknownError)) throw error;
      log.agentBooter(
        'machine %s (provider ID %s): %s; waiting for its enrollment all the same',
        boot.machineId,
        boot.providerId,
        error.message,
      );
      return { method: boot.asked, detail: `the power request's outcome is unknown: ${error.message}` };
    }
  }

  async #armNetworkBoot(db: Kysely<Database>, boot: BootUnderWay, machine: Machine, init: TakeoverInit): Promise<void> {
    await armNetworkBoot(db, {
      machineId: boot.machineId,
      bootId: boot.bootId,
      capability: newCapability(),
      // The inventory checked them; normalized as iPXE's request is.
      macs: machine.macs.map((mac) => normalizeMac(mac) ?? mac),
      takeoverInit: toBinary(TakeoverInitSchema, init),
      agentFlags: this.#agentFlags,
      tokenValidForSeconds: this.#tokenValidForSeconds(),
    });
    boot.networkArmed = true;
    log.agentBooter(
      'machine %s (provider ID %s): network boot armed for %s',
      boot.machineId,
      boot.providerId,
      machine.macs.join(', ') || 'no MAC',
    );
  }

  /**
   * Makes the token good for the wait from now. A failure (the BMDB failing
   * over) is logged, not failed on: the machine is booting, and the token
   * keeps the validity it was issued with.
   */
  async #renewToken(db: Kysely<Database>, boot: BootUnderWay): Promise<void> {
    try {
      await renewEnrollmentToken(db, boot.machineId, boot.bootId, { validForSeconds: this.#tokenValidForSeconds() });
    } catch (error) {
      log.agentBooter(
        'machine %s (provider ID %s): making its token good for the wait failed, it keeps its first expiry: %s',
        boot.machineId,
        boot.providerId,
        describeError(error),
      );
    }
  }

  /**
   * Waits for this boot's enrollment within the bound. A look that fails
   * (the BMDB failing over) is logged and looked again: the boot under way
   * is not what failed. A network boot whose config was fetched twice fails.
   */
  async #waitForEnrollment(
    db: Kysely<Database>,
    task: Task<ProvidedMachine>,
    boot: BootUnderWay,
    started: AgentBootStarted,
  ): Promise<void> {
    const { machineId, providerId } = boot;
    const since = Date.now();
    let lastFailure: unknown;
    for (;;) {
      let refetched: AgentBootConfigRefetchedError | undefined;
      try {
        if (boot.networkArmed) {
          const network = await networkBootState(db, machineId, boot.bootId);
          if (network?.configRefusedAt !== undefined) {
            refetched = new AgentBootConfigRefetchedError(
              machineId,
              providerId,
              network.configServedTo,
              network.configRefusedTo,
            );
          }
        }
        const enrollment = refetched ? undefined : await agentEnrollment(db, machineId);
        // The token carries its boot's ID: a token of another boot (the claim lost, the machine booted again) is not this one's.
        if (enrollment?.enrolledAt !== undefined && enrollment.bootId === boot.bootId) return;
        lastFailure = undefined;
      } catch (error) {
        lastFailure = error;
        log.agentBooter(
          'machine %s (provider ID %s): looking for its enrollment failed, looking again: %s',
          machineId,
          providerId,
          describeError(error),
        );
      }
      if (refetched) throw refetched;
      const waited = Date.now() - since;
      if (waited >= this.#enrollmentWithin) {
        throw new AgentEnrollmentTimeoutError(machineId, providerId, started, waited, lastFailure);
      }
      detail.agentBooter('machine %s: no enrollment yet after %d ms', machineId, waited);
      await sleep(Math.min(this.#pollInterval, this.#enrollmentWithin - waited), task.signal);
    }
  }

  /** The token outlives the wait by a grace, so an agent enrolling at the wait's last moment is not refused. */
  #tokenValidForSeconds(): number {
    return Math.ceil(this.#enrollmentWithin / 1000) + TOKEN_GRACE_SECONDS;
  }

  #db(): Kysely<Database> {
    if (this.#bmdb === undefined) throw new Error('agent booter: processMachine before run');
    return this.#bmdb.db;
  }

  /**
   * Cleans up this boot, whatever ended it, each step tried even when one
   * before failed: its token revoked unless used (nobody waits for it any
   * more), its network boot ended, its ISO forgotten, and its image ejected
   * by the method it started with. A step that fails is logged, not failed
   * on: the agent enrolled, or the work fails anyway. Only this boot's: a
   * later boot of the machine, after a claim this one lost, is left alone.
   */
  async #endBoot(db: Kysely<Database>, boot: BootUnderWay): Promise<void> {
    const { machineId, providerId, bootId } = boot;
    const step = async (what: string, act: () => Promise<unknown>): Promise<void> => {
      try {
        await act();
      } catch (error) {
        log.agentBooter(
          '%s of the agent boot of machine %s (provider ID %s) failed: %s',
          what,
          machineId,
          providerId,
          describeError(error),
        );
      }
    };
    await step('revoking the token', async () => {
      if (await revokeEnrollmentToken(db, machineId, bootId)) {
        log.agentBooter('machine %s (provider ID %s): its unused enrollment token revoked', machineId, providerId);
      }
    });
    if (boot.networkArmed) await step('ending the network boot', () => endNetworkBoot(db, machineId, bootId));
    const { media } = boot;
    if (media !== undefined) await step('forgetting the ISO', () => this.files.forget(media));
    const end: AgentBootEnd = { method: boot.started?.method ?? boot.asked, media: { isoUrl: media?.isoUrl } };
    await step('ending', () => this.provider.endAgentBoot(providerId, end));
  }
}

/** One boot of one machine, as far as it got: what its end cleans up. */
interface BootUnderWay {
  readonly machineId: string;
  readonly providerId: string;
  /** Carried by its token and its network boot, so its end touches them and no other boot's. */
  readonly bootId: string;
  /** The method the inventory said when the boot began. */
  readonly asked: 'virtual-media' | 'network';
  media: PreparedAgentBoot | undefined;
  networkArmed: boolean;
  started: AgentBootStarted | undefined;
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
