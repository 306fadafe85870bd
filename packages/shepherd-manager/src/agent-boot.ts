import { ShepherdError } from './provider.js';

/** What an agent boot boots: this boot's agent ISO, which carries the machine's one-time enrollment token. */
export interface AgentBootMedia {
  /**
   * Where the BMC fetches the ISO (`https://…/agent.iso`, under a path only
   * this boot knows). Absent for a machine whose inventory says `network`:
   * no ISO, and no token, is made for a boot that does not use one.
   */
  readonly isoUrl?: string | undefined;
}

/** The boot an {@link AgentBootControl.endAgentBoot} ends: how it was started, and with what. */
export interface AgentBootEnd {
  /** The method it started with (or was asked with, when `bootAgent` threw), whatever the inventory says now. */
  readonly method: 'virtual-media' | 'network';
  /** What `bootAgent` was given: only an image at this URL is ejected. */
  readonly media: AgentBootMedia;
}

/** What a provider started: the boot method it used, and in its own words how (for logs and history). */
export interface AgentBootStarted {
  /** `virtual-media`, or `network` (also when virtual media was asked for and the provider fell back). */
  readonly method: 'virtual-media' | 'network';
  /** What the BMC was told, e.g. `virtual media inserted on …; boot override Cd (Once, UEFI); ForceRestart`. */
  readonly detail: string;
}

/**
 * Booting a machine into the agent through its BMC, for machines with no OS
 * to take over over SSH: an agent boot. The port is the shepherd's, so it is
 * declared here; the static provider implements it through Redfish and
 * IPMI, the dummy provider pretends. Machine IDs are provider IDs.
 *
 * A machine the provider does not know is {@link MachineNotFoundError}; one
 * whose agent cannot be booted this way, {@link AgentBootError}; a BMC's
 * refusal is the provider's own error, naming the machine and the BMC.
 */
export interface AgentBootControl {
  /** The provider's name, as stored in `machine_provided.provider`. */
  readonly type: string;
  /**
   * Boots the machine into the agent: virtual media (insert, one-time boot
   * override to Cd read back and retried, power on or reset), or network
   * (one-time PXE boot, power on or cycle). Resolves once the BMC accepted
   * the power request; the agent's enrollment is awaited elsewhere.
   */
  bootAgent(id: string, media: AgentBootMedia, signal?: AbortSignal): Promise<AgentBootStarted>;
  /**
   * After enrollment (or giving up): ejects the virtual media if it still
   * holds this boot's image (`boot.media.isoUrl`), and nothing else: another
   * boot's image, inserted since, stays. Nothing for a network boot.
   */
  endAgentBoot(id: string, boot: AgentBootEnd, signal?: AbortSignal): Promise<void>;
}

/** A machine's agent cannot be booted through its BMC; the message names the machine and what refused. */
export class AgentBootError extends ShepherdError {
  override name = 'AgentBootError';
  constructor(
    /** The machine's provider ID. */
    readonly machine: string,
    /** What refused, and why: `the inventory says agentBoot ssh`, say. */
    readonly refusal: string,
    options?: ErrorOptions,
  ) {
    super(`machine ${machine}: the agent cannot be booted: ${refusal}`, options);
  }
}
