/**
 * Every error this package throws on purpose is one of these classes, so
 * callers branch with `instanceof`. Messages name the endpoint, device,
 * reservation or project involved, and never contain the API token.
 */

/** Base class of the Equinix provider's errors. */
export class EquinixError extends Error {
  override name = 'EquinixError';
}

/** The API answered with an error status (after any retries). */
export class EquinixApiError extends EquinixError {
  override name = 'EquinixApiError';
  constructor(
    /** HTTP method of the request. */
    readonly method: string,
    /** Path requested, relative to the API base (e.g. `/devices/9f1c…`). */
    readonly endpoint: string,
    /** HTTP status code of the last answer. */
    readonly status: number,
    /** The API's own explanation (`errors[]` joined, or `error`), or the status text. */
    readonly apiMessage: string,
    /** Attempts made, retries included. */
    readonly attempts: number,
  ) {
    super(
      `Equinix API ${method} ${endpoint} failed with HTTP ${status}: ${apiMessage}${attempts > 1 ? ` (after ${attempts} attempts)` : ''}`,
    );
  }
}

/** No answer from the API: a network failure or a timeout (after any retries). */
export class EquinixRequestError extends EquinixError {
  override name = 'EquinixRequestError';
  constructor(
    readonly method: string,
    readonly endpoint: string,
    /** The request ran out of time rather than failing outright. */
    readonly timedOut: boolean,
    readonly attempts: number,
    detail: string,
    options?: ErrorOptions,
  ) {
    super(
      `Equinix API ${method} ${endpoint} ${timedOut ? 'timed out' : 'failed'}: ${detail}${attempts > 1 ? ` (after ${attempts} attempts)` : ''}`,
      options,
    );
  }
}

/** The API answered with success but a body that is not the JSON expected. */
export class EquinixResponseError extends EquinixError {
  override name = 'EquinixResponseError';
  constructor(
    readonly method: string,
    readonly endpoint: string,
    detail: string,
  ) {
    super(`Equinix API ${method} ${endpoint} returned a malformed response: ${detail}`);
  }
}

/** A hardware reservation cannot be used for a new device right now. */
export class ReservationUnavailableError extends EquinixError {
  override name = 'ReservationUnavailableError';
  constructor(
    readonly reservationId: string,
    readonly reason: string,
  ) {
    super(`hardware reservation ${reservationId} is unavailable: ${reason}`);
  }
}

/**
 * Someone else provisioned the reservation first (the API refused the create
 * with 409, or 422 about the reservation). Not retried: the reservation is gone.
 */
export class ReservationTakenError extends ReservationUnavailableError {
  override name = 'ReservationTakenError';
  constructor(
    reservationId: string,
    /** HTTP status of the refusal. */
    readonly status: number,
    /** The API's explanation. */
    readonly apiMessage: string,
  ) {
    super(reservationId, `already provisioned by someone else (HTTP ${status}: ${apiMessage})`);
  }
}

/**
 * `createMachine` was asked to take over an existing device that the shepherd
 * did not create (wrong prefix, or a hostname that does not carry its
 * reservation ID).
 */
export class DeviceNotAdoptableError extends EquinixError {
  override name = 'DeviceNotAdoptableError';
  constructor(
    readonly deviceId: string,
    readonly hostname: string,
    readonly reason: string,
  ) {
    super(`device ${deviceId} (${hostname}) cannot be adopted: ${reason}`);
  }
}

/**
 * The device exists at Equinix but recording it in the BMDB failed. The
 * device is not lost: the next `listMachines` reports it as `PossiblyUsed`,
 * and `createMachine` on it adopts it.
 */
export class DeviceNotRecordedError extends EquinixError {
  override name = 'DeviceNotRecordedError';
  constructor(
    readonly deviceId: string,
    readonly reservationId: string | undefined,
    detail: string,
    options?: ErrorOptions,
  ) {
    super(
      `device ${deviceId}${reservationId ? ` (reservation ${reservationId})` : ''} exists at Equinix but was not recorded in the BMDB: ${detail}`,
      options,
    );
  }
}
