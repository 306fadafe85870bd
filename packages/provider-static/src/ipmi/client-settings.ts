// The IPMI client's options and their checks.

import { optionChecks } from '../internal/settings.js';

const { positive, atLeastZero, whole } = optionChecks('IpmiClient');

/** Options of the {@link IpmiClient}. Durations in milliseconds. */
export interface IpmiClientOptions {
  /** The ipmitool program: a name looked up on `PATH`, or a path. Default `ipmitool`. */
  readonly ipmitool?: string | undefined;
  /** Time for one ipmitool run, session included; the child is killed after it. Default 30 s. */
  readonly timeout?: number | undefined;
  /**
   * Runs per command, the first included; only an unreachable BMC, an
   * unanswered command and timeouts are retried, a reset or cycle only when
   * no session was set up. Default 3.
   */
  readonly maxAttempts?: number | undefined;
  /** Pause before the first retry, doubling after (with jitter). Default 1 s. */
  readonly retryDelay?: number | undefined;
  /** Commands in flight at once across the fleet: BMCs are slow and serve few sessions. Default 8. */
  readonly concurrency?: number | undefined;
  /**
   * ipmitool's own wait for each RMCP+ message in seconds (`-N`), and its
   * retransmissions (`-R`; a reset or cycle is never retransmitted: `-R 1`).
   * Default: ipmitool's (about 20 s for a silent BMC).
   */
  readonly messageTimeout?: number | undefined;
  readonly messageRetries?: number | undefined;
}

/** The client's settings after defaults. */
export interface IpmiClientSettings {
  readonly ipmitool: string;
  readonly timeout: number;
  readonly maxAttempts: number;
  readonly retryDelay: number;
  readonly concurrency: number;
  readonly messageTimeout: number | undefined;
  readonly messageRetries: number | undefined;
}

/** `options` with defaults filled in, each checked: a bad value is a `RangeError` naming it. */
export function ipmiClientSettings(options: IpmiClientOptions): IpmiClientSettings {
  const ipmitool = options.ipmitool ?? 'ipmitool';
  if (ipmitool === '') throw new RangeError('IpmiClient: ipmitool must be a program name or path, got ""');
  return Object.freeze({
    ipmitool,
    timeout: positive('timeout', options.timeout ?? 30_000),
    maxAttempts: whole('maxAttempts', options.maxAttempts ?? 3, 1),
    retryDelay: atLeastZero('retryDelay', options.retryDelay ?? 1_000),
    concurrency: whole('concurrency', options.concurrency ?? 8, 1),
    messageTimeout:
      options.messageTimeout === undefined ? undefined : whole('messageTimeout', options.messageTimeout, 1),
    messageRetries:
      options.messageRetries === undefined ? undefined : whole('messageRetries', options.messageRetries, 0),
  });
}
