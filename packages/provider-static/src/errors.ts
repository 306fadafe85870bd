import { ShepherdError } from '@bmaas/shepherd-manager';

/** Base class of this package's errors. */
export class StaticProviderError extends ShepherdError {
  override name = 'StaticProviderError';
}

/** Where in an inventory a problem is: the entry (index, and `id` when it has one) and the field. */
export interface InventoryLocation {
  /** Zero-based index of the entry in the inventory array. */
  readonly index?: number | undefined;
  /** The entry's `id`, when it has a readable one. */
  readonly id?: string | undefined;
  /** The field, dotted (`bmc.url`). */
  readonly field?: string | undefined;
}

/**
 * The inventory cannot be used: unreadable, not JSON, or an entry that fails
 * validation. The message names the file or URL, the entry and the field;
 * it never holds a password.
 */
export class InventoryError extends StaticProviderError {
  override name = 'InventoryError';
  constructor(
    /** The inventory's path or URL. */
    readonly source: string,
    readonly location: InventoryLocation,
    readonly problem: string,
    options?: ErrorOptions,
  ) {
    super(`inventory ${source}: ${describeLocation(location)}${problem}`, options);
  }
}

function describeLocation({ index, id, field }: InventoryLocation): string {
  const parts: string[] = [];
  if (index !== undefined) parts.push(`entry ${index}${id === undefined ? '' : ` (id ${JSON.stringify(id)})`}`);
  if (field !== undefined) parts.push(`field ${field}`);
  return parts.length === 0 ? '' : `${parts.join(', ')}: `;
}

/** The protocol a BMC is spoken to in: Redfish over HTTPS, or IPMI through `ipmitool`. */
export type BmcProtocol = 'redfish' | 'ipmi';

/**
 * A machine's BMC did not do what was asked, in either protocol: the base of
 * the BMC errors, one tree for Redfish and IPMI, with the protocol as a
 * field. The message names the machine, the BMC (`BMC <url>`, or `IPMI BMC
 * <host:port>`) and the cause; never the password.
 */
export class BmcError extends StaticProviderError {
  override name = 'BmcError';
  constructor(
    /** The machine's provider ID (its inventory `id`). */
    readonly machine: string,
    readonly protocol: BmcProtocol,
    /**
     * The BMC asked: the Redfish URL the request went to (the ComputerSystem
     * or its reset target), or the IPMI BMC's `host:port`; `undefined` when
     * none was asked (its credentials could not be had).
     */
    readonly bmc: string | undefined,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`machine ${machine}: ${bmc === undefined ? '' : `${bmcName(protocol, bmc)}: `}${problem}`, options);
  }
}

function bmcName(protocol: BmcProtocol, bmc: string): string {
  return protocol === 'ipmi' ? `IPMI BMC ${bmc}` : `BMC ${bmc}`;
}

/**
 * The BMC's credentials are the problem: the BMC refused them (Redfish 401
 * or 403; an IPMI session refused: unknown user, wrong password, too little
 * privilege), or they cannot be had (no user name or password in the
 * inventory or the flags, an unreadable or too open password file; then no
 * BMC was asked). Not retried: the same credentials fail again.
 */
export class BmcCredentialsError extends BmcError {
  override name = 'BmcCredentialsError';
  constructor(
    machine: string,
    protocol: BmcProtocol,
    bmc: string | undefined,
    problem: string,
    /** The user name the BMC refused; `undefined` when it was not asked. */
    readonly username?: string | undefined,
    /** The HTTP status of a Redfish refusal, 401 or 403. */
    readonly status?: number | undefined,
  ) {
    super(machine, protocol, bmc, problem);
  }
}

/** The BMC could not be reached or did not answer (refused, reset, no route, TLS failure, …), after retries. */
export class BmcUnreachableError extends BmcError {
  override name = 'BmcUnreachableError';
}

/** No answer within the client's timeout (after retries); an `ipmitool` run was killed. */
export class BmcTimeoutError extends BmcError {
  override name = 'BmcTimeoutError';
  constructor(
    machine: string,
    protocol: BmcProtocol,
    bmc: string,
    /** What was asked: the HTTP method (`POST`), or the IPMI command (`chassis power status`). */
    readonly request: string,
    readonly timeout: number,
  ) {
    super(
      machine,
      protocol,
      bmc,
      protocol === 'ipmi'
        ? `${request}: ipmitool got no answer within ${timeout} ms and was killed (timeout)`
        : `${request} got no answer within ${timeout} ms (timeout)`,
    );
  }
}

/**
 * The BMC does not support what was asked: Redfish without a
 * `#ComputerSystem.Reset` action or target, or without an allowable reset
 * type the shepherd uses (or the one `--redfish-reset-type` asks for); an
 * IPMI command it refuses ("Invalid command", "Invalid data field in
 * request"), or the cipher suite the inventory names. Not retried.
 */
export class BmcUnsupportedError extends BmcError {
  override name = 'BmcUnsupportedError';
}

/**
 * The BMC has no virtual media an agent boot can use: no `VirtualMedia`
 * collection on the ComputerSystem or its Manager, no CD or DVD among them,
 * or no `#VirtualMedia.InsertMedia` action. A machine with MACs in the
 * inventory is network-booted instead.
 */
export class VirtualMediaUnsupportedError extends BmcUnsupportedError {
  override name = 'VirtualMediaUnsupportedError';
}

/**
 * The BMC answered something its protocol does not (not a Redfish
 * ComputerSystem, a link to another origin), or refused what an agent boot
 * asked of it (an `InsertMedia` answered with an error); the message names
 * what refused.
 */
export class BmcResponseError extends BmcError {
  override name = 'BmcResponseError';
}

/**
 * The BMC accepted a one-time boot override and did not keep it: read back
 * after each attempt (Redfish's `Boot`, IPMI's boot flags, `chassis
 * bootparam get 5`), it still said otherwise when the attempts ran out.
 * iDRAC, Supermicro and others are known to drop an override now and then.
 */
export class BootOverrideIgnoredError extends BmcError {
  override name = 'BootOverrideIgnoredError';
  constructor(
    machine: string,
    protocol: BmcProtocol,
    bmc: string,
    /** What was asked: `Cd (Once, UEFI)`, `pxe (next boot, EFI)`. */
    readonly wanted: string,
    /** What the BMC said last when read back. */
    readonly readBack: string,
    readonly attempts: number,
  ) {
    super(
      machine,
      protocol,
      bmc,
      `ignored the one-time boot override to ${wanted}: read back it says ${readBack}, after ${attempts} attempt(s)`,
    );
  }
}

/** A Redfish BMC answered an HTTP status other than the ones expected (after retries for 5xx). */
export class RedfishHttpError extends BmcError {
  override name = 'RedfishHttpError';
  constructor(
    machine: string,
    url: string,
    readonly method: string,
    readonly status: number,
    /** The start of the body, for the operator (Redfish errors carry a message there). */
    readonly detail: string,
  ) {
    super(machine, 'redfish', url, `${method} answered HTTP ${status}${detail === '' ? '' : `: ${detail}`}`);
  }
}

/** `ipmitool` failed some other way; its message is in {@link IpmiCommandError.detail}. Not retried. */
export class IpmiCommandError extends BmcError {
  override name = 'IpmiCommandError';
  constructor(
    machine: string,
    bmc: string,
    readonly command: string,
    /** ipmitool's own last words (the password scrubbed). */
    readonly detail: string,
  ) {
    super(machine, 'ipmi', bmc, `${command} failed: ${detail}`);
  }
}

/** The machine has no `bmc` in the inventory, so its power cannot be controlled. */
export class NoBmcError extends StaticProviderError {
  override name = 'NoBmcError';
  constructor(readonly machine: string) {
    super(
      `machine ${machine} has no bmc in the inventory: its power cannot be read or controlled; add its Redfish URL`,
    );
  }
}

/** The `ipmitool` program is not installed (or not at the configured path). */
export class IpmitoolMissingError extends StaticProviderError {
  override name = 'IpmitoolMissingError';
  constructor(
    /** The program the client tried to run. */
    readonly program: string,
  ) {
    super(
      `${program} not found: IPMI BMCs are driven through ipmitool; install Debian's ipmitool package (apt-get install ipmitool)`,
    );
  }
}
