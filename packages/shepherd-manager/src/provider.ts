import type { Session } from '@bmaas/bmdb-controlloop';
import type { AgentBootMethod } from '@bmaas/bmdb-model';

/**
 * Whether a provider machine is in use by us. `PossiblyUsed` means the
 * provider cannot tell on its own; the provisioner resolves it against the
 * BMDB (present there: used; absent, or no ID: unused).
 */
export const Availability = {
  KnownUnused: 'KnownUnused',
  KnownUsed: 'KnownUsed',
  PossiblyUsed: 'PossiblyUsed',
} as const;
export type Availability = (typeof Availability)[keyof typeof Availability];

/** A machine (or a unit of capacity that can become one) as its provider sees it. */
export interface Machine {
  /**
   * The provider's ID for the machine, as stored in `machine_provided.provider_id`.
   * `undefined` when the provider has no stable ID for it yet (only possible
   * for capacity that is not in use).
   */
  readonly id: string | undefined;
  /** IP address (v4 or v6 literal) the shepherd reaches it at over SSH, if known. */
  readonly address: string | undefined;
  readonly availability: Availability;
  /**
   * The provider gave up on this machine (e.g. provisioning failed for good).
   * Failed machines are exempt from the provider/BMDB discrepancy check.
   */
  readonly failed: boolean;
  /** How the machine's agent arrives: over SSH (a takeover), or booted by its BMC. */
  readonly agentBoot: AgentBootMethod;
  /** The machine's NIC MAC addresses (lower case, colon-separated), for a network boot; empty when unknown. */
  readonly macs: readonly string[];
}

/** What the provisioner asks a provider to create. */
export interface CreateMachineRequest {
  /** A machine the provider listed as `KnownUnused` (or resolved to it). */
  readonly unusedMachine: Machine;
}

/**
 * A source of machines: a cloud API, a hardware inventory, a test double.
 * Implementations must make `createMachine` record the machine in the BMDB
 * (a new machine with its Provided tag) in the same step that takes it.
 */
export interface Provider {
  /** The provider's name, as stored in `machine_provided.provider`. */
  readonly type: string;
  /**
   * Every machine the provider would have us manage: those in use by us
   * (`KnownUsed` / `PossiblyUsed`) and available capacity (`KnownUnused`).
   */
  listMachines(signal?: AbortSignal): Promise<Machine[]>;
  /**
   * One machine by provider ID.
   *
   * @throws {@link MachineNotFoundError} when the provider does not know it
   */
  getMachine(id: string, signal?: AbortSignal): Promise<Machine>;
  /**
   * Takes `request.unusedMachine` into use and records it in the BMDB through
   * `session` (new machine + Provided tag). Returns the machine now in use.
   */
  createMachine(session: Session, request: CreateMachineRequest, signal?: AbortSignal): Promise<Machine>;
}

/** Base class of the shepherd's errors. */
export class ShepherdError extends Error {
  override name = 'ShepherdError';
}

/** The provider does not know a machine by this ID. */
export class MachineNotFoundError extends ShepherdError {
  override name = 'MachineNotFoundError';
  constructor(
    readonly provider: string,
    readonly providerId: string,
  ) {
    super(`provider ${provider} has no machine ${providerId}`);
  }
}

/** The provider does not implement this operation. */
export class NotImplementedError extends ShepherdError {
  override name = 'NotImplementedError';
  constructor(
    readonly provider: string,
    readonly operation: string,
  ) {
    super(`provider ${provider} does not implement ${operation}`);
  }
}
