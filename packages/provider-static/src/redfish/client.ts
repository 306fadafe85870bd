import { describeError, sleep } from '@bmaas/bmdb-controlloop';
import { type Secret, Semaphore } from '@bmaas/shepherd-manager';
import { Agent, type Dispatcher, request } from 'undici';
import {
  RedfishCredentialsError,
  type RedfishError,
  RedfishHttpError,
  RedfishNetworkError,
  RedfishResetUnsupportedError,
  RedfishResponseError,
  RedfishTimeoutError,
} from '../errors.js';
import { log } from '../internal/log.js';

/** Reset types of Redfish's `ComputerSystem.Reset` action (DSP0268 `ResetType`). */
export const RESET_TYPES = [
  'On',
  'ForceOff',
  'GracefulShutdown',
  'GracefulRestart',
  'ForceRestart',
  'Nmi',
  'ForceOn',
  'PushPowerButton',
  'PowerCycle',
  'Suspend',
  'Pause',
  'Resume',
] as const;
export type ResetType = (typeof RESET_TYPES)[number];

/**
 * The reset types that power-cycle a machine, best first: a hard restart
 * works on a hung OS, a power cycle does too but is slower, a graceful
 * restart only when the OS still answers ACPI.
 */
export const RESTART_PREFERENCE: readonly ResetType[] = ['ForceRestart', 'PowerCycle', 'GracefulRestart'];

/** A BMC to talk to: one machine's ComputerSystem and the credentials for it. */
export interface RedfishTarget {
  /** The machine's name in messages and logs (its provider ID). */
  readonly machine: string;
  /** The ComputerSystem resource, `https://bmc/redfish/v1/Systems/1`. */
  readonly url: string;
  readonly username: string;
  readonly password: Secret;
  /** Skip TLS certificate verification (logged once per machine). */
  readonly insecure?: boolean | undefined;
}

/** What the client read of a ComputerSystem. */
export interface RedfishSystem {
  /** Absolute URL of the `#ComputerSystem.Reset` action, `undefined` when the system has none. */
  readonly resetTarget: string | undefined;
  /** `ResetType@Redfish.AllowableValues` (or from the action's ActionInfo); `undefined` when not listed. */
  readonly allowableResetTypes: readonly string[] | undefined;
  readonly powerState: string | undefined;
}

/** A reset the BMC accepted. */
export interface RedfishReset {
  readonly resetType: ResetType;
  /** The action URL it was posted to. */
  readonly target: string;
  /** The HTTP status of the acceptance: 200, 202 or 204. */
  readonly status: number;
}

/** Options of the {@link RedfishClient}. Durations in milliseconds. */
export interface RedfishClientOptions {
  /** PEM CA certificate(s) to verify BMCs with, instead of the system trust store (`--redfish-ca-file`). */
  readonly ca?: string | Buffer | undefined;
  /** Time for each request, connection to last byte. Default 30 s. */
  readonly timeout?: number | undefined;
  /** Attempts per request, the first included; only network errors, timeouts and 5xx are retried. Default 3. */
  readonly maxAttempts?: number | undefined;
  /** Pause before the first retry, doubling after (with jitter). Default 1 s. */
  readonly retryDelay?: number | undefined;
  /** Resets in flight at once across the fleet: BMCs are slow and serve few clients. Default 8. */
  readonly concurrency?: number | undefined;
}

/** The client's settings after defaults. */
export interface RedfishClientSettings {
  readonly timeout: number;
  readonly maxAttempts: number;
  readonly retryDelay: number;
  readonly concurrency: number;
}

const ACCEPTED = new Set([200, 202, 204]);
/** Longest body read from a BMC: a ComputerSystem is a few KiB. */
const MAX_BODY_BYTES = 1024 * 1024;

/**
 * A small Redfish client: just what power-cycling a machine through its BMC
 * takes. HTTP basic authentication; TLS verified against the system trust
 * store or the given CA; timeouts on every request; retries with jitter for
 * network errors, timeouts and 5xx (never 4xx); a bound on resets in flight
 * across the fleet.
 *
 * @example
 * ```ts
 * const client = new RedfishClient({ timeout: 10_000 });
 * const reset = await client.resetSystem({ machine: 'node07', url: 'https://10.1.7.7/redfish/v1/Systems/1',
 *   username: 'admin', password: new Secret(secret) });
 * console.log(reset.resetType); // ForceRestart
 * await client.close();
 * ```
 */
export class RedfishClient {
  readonly settings: RedfishClientSettings;
  readonly #verified: Agent;
  #insecure: Agent | undefined;
  readonly #slots: Semaphore;
  /** Machines already warned about (insecure TLS, plain http). */
  readonly #warned = new Set<string>();

  constructor(options: RedfishClientOptions = {}) {
    this.settings = Object.freeze({
      timeout: positive('timeout', options.timeout ?? 30_000),
      maxAttempts: whole('maxAttempts', options.maxAttempts ?? 3),
      retryDelay: atLeastZero('retryDelay', options.retryDelay ?? 1_000),
      concurrency: whole('concurrency', options.concurrency ?? 8),
    });
    this.#verified = new Agent({ connect: options.ca === undefined ? {} : { ca: options.ca } });
    this.#slots = new Semaphore(this.settings.concurrency);
  }

  /**
   * Power-cycles the machine: reads its ComputerSystem, picks the reset type
   * (`resetType` if given and allowed, else the first of
   * {@link RESTART_PREFERENCE} the system allows) and posts the reset.
   *
   * @throws {@link RedfishCredentialsError} on 401/403
   * @throws {@link RedfishResetUnsupportedError} without a reset action or a usable reset type
   * @throws {@link RedfishTimeoutError}, {@link RedfishNetworkError}, {@link RedfishHttpError} after retries
   */
  async resetSystem(
    target: RedfishTarget,
    options: { resetType?: ResetType | undefined } = {},
    signal?: AbortSignal,
  ): Promise<RedfishReset> {
    const release = await this.#slots.acquire(signal);
    try {
      const system = await this.#getSystem(target, signal);
      if (system.resetTarget === undefined) {
        throw new RedfishResetUnsupportedError(
          target.machine,
          target.url,
          'the ComputerSystem has no #ComputerSystem.Reset action with a target',
        );
      }
      const resetType = chooseResetType(target, system.allowableResetTypes, options.resetType);
      const status = await this.#send(target, 'POST', system.resetTarget, { ResetType: resetType }, signal);
      log.redfish(
        'machine %s: %s accepted by %s (HTTP %d)',
        target.machine,
        resetType,
        system.resetTarget,
        status.status,
      );
      return { resetType, target: system.resetTarget, status: status.status };
    } finally {
      release();
    }
  }

  /** Reads a ComputerSystem: its reset action, allowable reset types and power state. */
  async getSystem(target: RedfishTarget, signal?: AbortSignal): Promise<RedfishSystem> {
    const release = await this.#slots.acquire(signal);
    try {
      return await this.#getSystem(target, signal);
    } finally {
      release();
    }
  }

  /** Closes idle connections. */
  async close(): Promise<void> {
    await Promise.all([this.#verified.close(), this.#insecure?.close()]);
  }

  async #getSystem(target: RedfishTarget, signal: AbortSignal | undefined): Promise<RedfishSystem> {
    const { body } = await this.#send(target, 'GET', target.url, undefined, signal);
    if (!isRecord(body)) {
      throw new RedfishResponseError(target.machine, target.url, 'the answer is not a Redfish resource (JSON object)');
    }
    const actions = isRecord(body.Actions) ? body.Actions : undefined;
    const reset = actions && isRecord(actions['#ComputerSystem.Reset']) ? actions['#ComputerSystem.Reset'] : undefined;
    let resetTarget: string | undefined;
    if (reset && typeof reset.target === 'string' && reset.target !== '') {
      resetTarget = this.#sameOrigin(target, reset.target);
    }
    let allowable = reset ? stringArray(reset['ResetType@Redfish.AllowableValues']) : undefined;
    const actionInfo = reset?.['@Redfish.ActionInfo'];
    if (allowable === undefined && typeof actionInfo === 'string') {
      allowable = await this.#actionInfoResetTypes(target, this.#sameOrigin(target, actionInfo), signal);
    }
    return {
      resetTarget,
      allowableResetTypes: allowable,
      powerState: typeof body.PowerState === 'string' ? body.PowerState : undefined,
    };
  }

  /** `ResetType` allowable values from an ActionInfo resource, where a BMC lists them there. */
  async #actionInfoResetTypes(
    target: RedfishTarget,
    url: string,
    signal: AbortSignal | undefined,
  ): Promise<string[] | undefined> {
    const { body } = await this.#send(target, 'GET', url, undefined, signal);
    const parameters = isRecord(body) && Array.isArray(body.Parameters) ? body.Parameters : [];
    const resetType = parameters.find((p): p is Record<string, unknown> => isRecord(p) && p.Name === 'ResetType');
    return resetType ? stringArray(resetType.AllowableValues) : undefined;
  }

  /** A link of the BMC's resolved against the system URL; another origin would get our credentials: refused. */
  #sameOrigin(target: RedfishTarget, link: string): string {
    const base = new URL(target.url);
    const resolved = new URL(link, base);
    if (resolved.origin !== base.origin) {
      throw new RedfishResponseError(
        target.machine,
        target.url,
        `the BMC links to ${resolved.origin}, another origin; refusing to send it the credentials`,
      );
    }
    return resolved.href;
  }

  /** One request with retries; resolves with the parsed body of an accepted answer. */
  async #send(
    target: RedfishTarget,
    method: 'GET' | 'POST',
    url: string,
    payload: unknown,
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; body: unknown }> {
    const dispatcher = this.#dispatcher(target, url);
    const { maxAttempts, retryDelay } = this.settings;
    for (let attempt = 1; ; attempt++) {
      let failure: RedfishError;
      try {
        return await this.#attempt(target, dispatcher, method, url, payload, signal);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (!(error instanceof RetryableError)) throw error;
        failure = error.failure;
      }
      if (attempt >= maxAttempts) throw failure;
      // Exponential with "equal jitter": BMCs failing together are not all asked again together.
      const ceiling = retryDelay * 2 ** (attempt - 1);
      const pause = ceiling / 2 + Math.random() * (ceiling / 2);
      log.redfish(
        'machine %s: %s %s failed (%s); attempt %d of %d in %d ms',
        target.machine,
        method,
        url,
        failure.message,
        attempt + 1,
        maxAttempts,
        Math.round(pause),
      );
      await sleep(pause, signal);
    }
  }

  async #attempt(
    target: RedfishTarget,
    dispatcher: Dispatcher,
    method: 'GET' | 'POST',
    url: string,
    payload: unknown,
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; body: unknown }> {
    const timeout = this.settings.timeout;
    const timer = AbortSignal.timeout(timeout);
    const authorization = `Basic ${Buffer.from(`${target.username}:${target.password.reveal()}`).toString('base64')}`;
    let statusCode: number;
    let text: string;
    try {
      const response = await request(url, {
        method,
        dispatcher,
        signal: signal ? AbortSignal.any([signal, timer]) : timer,
        headers: {
          authorization,
          accept: 'application/json',
          'odata-version': '4.0',
          ...(payload === undefined ? {} : { 'content-type': 'application/json' }),
        },
        ...(payload === undefined ? {} : { body: JSON.stringify(payload) }),
      });
      statusCode = response.statusCode;
      text = await readBody(response.body);
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      if (timer.aborted) throw new RetryableError(new RedfishTimeoutError(target.machine, url, method, timeout));
      const problem = target.password.scrub(describeError(error));
      throw new RetryableError(
        new RedfishNetworkError(target.machine, url, `${method} failed: ${problem}`, { cause: error }),
      );
    }
    if (statusCode === 401 || statusCode === 403) {
      throw new RedfishCredentialsError(target.machine, url, statusCode, target.username);
    }
    const accepted = method === 'GET' ? statusCode === 200 : ACCEPTED.has(statusCode);
    if (!accepted) {
      const error = new RedfishHttpError(target.machine, url, method, statusCode, target.password.scrub(detail(text)));
      if (statusCode >= 500) throw new RetryableError(error);
      throw error;
    }
    if (text.trim() === '') return { status: statusCode, body: undefined };
    try {
      return { status: statusCode, body: JSON.parse(text) };
    } catch {
      if (method === 'POST') return { status: statusCode, body: undefined };
      throw new RedfishResponseError(
        target.machine,
        url,
        `${method} answered HTTP ${statusCode} with a body that is not JSON`,
      );
    }
  }

  #dispatcher(target: RedfishTarget, url: string): Dispatcher {
    const protocol = new URL(url).protocol;
    if (protocol === 'http:') {
      this.#warnOnce(
        `${target.machine}/http`,
        'machine %s: BMC %s is plain http://: credentials and resets cross the network unencrypted',
        target.machine,
        target.url,
      );
      return this.#verified;
    }
    if (!target.insecure) return this.#verified;
    this.#warnOnce(
      `${target.machine}/insecure`,
      'machine %s: TLS certificate of BMC %s is not verified (insecure: true in the inventory)',
      target.machine,
      target.url,
    );
    this.#insecure ??= new Agent({ connect: { rejectUnauthorized: false } });
    return this.#insecure;
  }

  #warnOnce(key: string, format: string, ...args: unknown[]): void {
    if (this.#warned.has(key)) return;
    this.#warned.add(key);
    log.redfish(`warning: ${format}`, ...args);
  }
}

/** A failure worth another attempt: network errors, timeouts, 5xx. */
class RetryableError extends Error {
  constructor(readonly failure: RedfishError) {
    super(failure.message);
  }
}

/**
 * The reset type to use: the override if the system allows it (or lists
 * nothing), else the first of {@link RESTART_PREFERENCE} it allows.
 */
export function chooseResetType(
  target: Pick<RedfishTarget, 'machine' | 'url'>,
  allowable: readonly string[] | undefined,
  override: ResetType | undefined,
): ResetType {
  const listed = allowable === undefined ? 'none listed' : `allowed: ${allowable.join(', ') || 'none'}`;
  if (override !== undefined) {
    if (allowable === undefined || allowable.includes(override)) return override;
    throw new RedfishResetUnsupportedError(
      target.machine,
      target.url,
      `reset type ${override} (--redfish-reset-type) is not allowed by the BMC (${listed})`,
    );
  }
  const chosen = RESTART_PREFERENCE.find((type) => allowable?.includes(type));
  if (chosen === undefined) {
    throw new RedfishResetUnsupportedError(
      target.machine,
      target.url,
      `no allowable reset type to power-cycle with (want one of ${RESTART_PREFERENCE.join(', ')}; ${listed}); ` +
        'set --redfish-reset-type if the BMC accepts one it does not list',
    );
  }
  return chosen;
}

async function readBody(body: Dispatcher.ResponseData['body']): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) {
      body.destroy();
      throw new Error(`answer larger than ${MAX_BODY_BYTES} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** A Redfish error body's message, or the start of the body. */
function detail(text: string): string {
  let message = text.trim();
  try {
    const parsed: unknown = JSON.parse(text);
    const error = isRecord(parsed) && isRecord(parsed.error) ? parsed.error : undefined;
    const extended = error?.['@Message.ExtendedInfo'];
    const first = Array.isArray(extended) && isRecord(extended[0]) ? extended[0].Message : undefined;
    if (typeof first === 'string') message = first;
    else if (typeof error?.message === 'string') message = error.message;
  } catch {}
  message = message.replace(/\s+/g, ' ');
  return message.length > 200 ? `${message.slice(0, 197)}...` : message;
}

function stringArray(value: unknown): string[] | undefined {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function positive(name: string, value: number): number {
  if (!(value > 0) || !Number.isFinite(value))
    throw new RangeError(`RedfishClient: ${name} must be > 0 ms, got ${value}`);
  return value;
}

function atLeastZero(name: string, value: number): number {
  if (!(value >= 0) || !Number.isFinite(value)) {
    throw new RangeError(`RedfishClient: ${name} must be >= 0 ms, got ${value}`);
  }
  return value;
}

function whole(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new RangeError(`RedfishClient: ${name} must be a whole number >= 1, got ${value}`);
  }
  return value;
}
