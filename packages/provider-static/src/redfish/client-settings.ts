// The client's options and their checks.

import { optionChecks } from '../internal/settings.js';

const { positive, atLeastZero, whole } = optionChecks('RedfishClient');

/** Options of the {@link RedfishClient}. Durations in milliseconds. */
export interface RedfishClientOptions {
  /** PEM CA certificate(s) to verify BMCs with, instead of the system trust store (`--redfish-ca-file`). */
  readonly ca?: string | Buffer | undefined;
  /** Time for each request, connection to last byte. Default 30 s. */
  readonly timeout?: number | undefined;
  /**
   * Attempts per request, the first included; only network errors, timeouts
   * and 5xx are retried, a restart only when it never went out or got 5xx.
   * Default 3.
   */
  readonly maxAttempts?: number | undefined;
  /** Pause before the first retry, doubling after (with jitter). Default 1 s. */
  readonly retryDelay?: number | undefined;
  /**
   * Resets (and an agent boot's steps: virtual media, a boot override) in
   * flight at once across the fleet: BMCs are slow and serve few clients. Default 8.
   */
  readonly concurrency?: number | undefined;
}

/** The client's settings after defaults. */
export interface RedfishClientSettings {
  readonly timeout: number;
  readonly maxAttempts: number;
  readonly retryDelay: number;
  readonly concurrency: number;
}

/** `options` with defaults filled in, each checked: a bad value is a `RangeError` naming it. */
export function clientSettings(options: RedfishClientOptions): RedfishClientSettings {
  return Object.freeze({
    timeout: positive('timeout', options.timeout ?? 30_000),
    maxAttempts: whole('maxAttempts', options.maxAttempts ?? 3),
    retryDelay: atLeastZero('retryDelay', options.retryDelay ?? 1_000),
    concurrency: whole('concurrency', options.concurrency ?? 8),
  });
}
