// Checks of a client's numeric options: a bad value is a RangeError naming the client and the option.

/** The checks, their messages prefixed with `owner` (`RedfishClient`, `IpmiClient`). */
export function optionChecks(owner: string) {
  return {
    /** A duration in ms, > 0. */
    positive(name: string, value: number): number {
      if (!(value > 0) || !Number.isFinite(value))
        throw new RangeError(`${owner}: ${name} must be > 0 ms, got ${value}`);
      return value;
    },
    /** A duration in ms, >= 0. */
    atLeastZero(name: string, value: number): number {
      if (!(value >= 0) || !Number.isFinite(value)) {
        throw new RangeError(`${owner}: ${name} must be >= 0 ms, got ${value}`);
      }
      return value;
    },
    /** A whole number, at least `least` (default 1). */
    whole(name: string, value: number, least = 1): number {
      if (!Number.isSafeInteger(value) || value < least) {
        throw new RangeError(`${owner}: ${name} must be a whole number >= ${least}, got ${value}`);
      }
      return value;
    },
  };
}
