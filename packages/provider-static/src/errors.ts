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

/** A machine's BMC could not be made to reset it. Names the machine and the BMC URL. */
export class RedfishError extends StaticProviderError {
  override name = 'RedfishError';
  constructor(
    /** The machine's provider ID (its inventory `id`). */
    readonly machine: string,
    /** The BMC URL the request went to (the ComputerSystem or its reset target). */
    readonly url: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`machine ${machine}: BMC ${url}: ${problem}`, options);
  }
}

/** The BMC answered 401 or 403. Not retried: the same credentials fail again. */
export class RedfishCredentialsError extends RedfishError {
  override name = 'RedfishCredentialsError';
  constructor(
    machine: string,
    url: string,
    readonly status: number,
    /** The user name the request was made as. */
    readonly username: string,
  ) {
    super(machine, url, `BMC refused the credentials of user ${JSON.stringify(username)} (HTTP ${status})`);
  }
}

/** The BMC answered an HTTP status other than the ones expected (after retries for 5xx). */
export class RedfishHttpError extends RedfishError {
  override name = 'RedfishHttpError';
  constructor(
    machine: string,
    url: string,
    readonly method: string,
    readonly status: number,
    /** The start of the body, for the operator (Redfish errors carry a message there). */
    readonly detail: string,
  ) {
    super(machine, url, `${method} answered HTTP ${status}${detail === '' ? '' : `: ${detail}`}`);
  }
}

/** No answer within the request timeout (after retries). */
export class RedfishTimeoutError extends RedfishError {
  override name = 'RedfishTimeoutError';
  constructor(
    machine: string,
    url: string,
    readonly method: string,
    readonly timeout: number,
  ) {
    super(machine, url, `${method} got no answer within ${timeout} ms (timeout)`);
  }
}

/** The BMC could not be reached (refused, reset, TLS failure, …), after retries. */
export class RedfishNetworkError extends RedfishError {
  override name = 'RedfishNetworkError';
}

/**
 * The ComputerSystem resource offers no usable reset: no
 * `#ComputerSystem.Reset` action or target, no allowable reset type the
 * shepherd uses, or not the one `--redfish-reset-type` asks for.
 */
export class RedfishResetUnsupportedError extends RedfishError {
  override name = 'RedfishResetUnsupportedError';
}

/** The BMC answered something that is not a Redfish ComputerSystem. */
export class RedfishResponseError extends RedfishError {
  override name = 'RedfishResponseError';
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

/** The BMC password cannot be had: no password, unreadable or too open password file. */
export class BmcCredentialsError extends StaticProviderError {
  override name = 'BmcCredentialsError';
  constructor(
    readonly machine: string,
    problem: string,
  ) {
    super(`machine ${machine}: ${problem}`);
  }
}

/**
 * A machine's IPMI BMC did not do what `ipmitool` asked. Names the machine,
 * the BMC (`host:port`) and the cause; never the password.
 */
export class IpmiError extends StaticProviderError {
  override name = 'IpmiError';
  constructor(
    /** The machine's provider ID (its inventory `id`). */
    readonly machine: string,
    /** The BMC, `host:port`. */
    readonly bmc: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`machine ${machine}: IPMI BMC ${bmc}: ${problem}`, options);
  }
}

/**
 * The BMC refused the session: unknown user, wrong password, or a user
 * without the privilege the command needs. Not retried: the same credentials
 * fail again.
 */
export class IpmiCredentialsError extends IpmiError {
  override name = 'IpmiCredentialsError';
}

/** No answer from the BMC (no route, nothing listening, name not found), after retries. */
export class IpmiUnreachableError extends IpmiError {
  override name = 'IpmiUnreachableError';
}

/** `ipmitool` did not finish within the client's timeout and was killed (after retries). */
export class IpmiTimeoutError extends IpmiError {
  override name = 'IpmiTimeoutError';
  constructor(
    machine: string,
    bmc: string,
    /** What was asked, `chassis power status`. */
    readonly command: string,
    readonly timeout: number,
  ) {
    super(machine, bmc, `${command}: ipmitool got no answer within ${timeout} ms and was killed (timeout)`);
  }
}

/**
 * The BMC does not support what was asked: the command (IPMI completion code
 * "Invalid command", "Invalid data field in request"), or the cipher suite
 * the inventory names. Not retried.
 */
export class IpmiUnsupportedError extends IpmiError {
  override name = 'IpmiUnsupportedError';
}

/** `ipmitool` failed some other way; its message is in {@link IpmiCommandError.detail}. Not retried. */
export class IpmiCommandError extends IpmiError {
  override name = 'IpmiCommandError';
  constructor(
    machine: string,
    bmc: string,
    readonly command: string,
    /** ipmitool's own last words (the password scrubbed). */
    readonly detail: string,
  ) {
    super(machine, bmc, `${command} failed: ${detail}`);
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
