import { randomUUID } from 'node:crypto';
import { parseLimiter, type RateLimiter } from '@bmaas/bmdb-controlloop';
import { Secret, Semaphore } from '@bmaas/common';
import type { Registry } from 'prom-client';
import { EquinixApiError, EquinixResponseError, ReservationTakenError } from '../errors.js';
import { sameKey } from '../internal/authorized-key.js';
import { detail } from '../internal/log.js';
import { EquinixApiMetrics } from './metrics.js';
import { type RetryPolicy, retryPolicy } from './retry.js';
import { type ApiRequest, type HttpMethod, Transport } from './transport.js';
import type {
  DeviceCreateRequest,
  EquinixDevice,
  EquinixHardwareReservation,
  EquinixMeta,
  EquinixSshKey,
} from './types.js';

/** Where the Equinix Metal API lives unless told otherwise. */
export const DEFAULT_EQUINIX_API_URL = 'https://api.equinix.com/metal/v1';

/**
 * Prefix of the tag that ties a device to the one `createDevice` call that
 * created it; the rest is a random UUID per call.
 */
export const CREATE_TAG_PREFIX = 'bmaas-create-';

/** Options for {@link EquinixClient}. Durations in milliseconds. */
export interface EquinixClientOptions {
  /** API key (`--equinix-api-key`), sent as `X-Auth-Token`. Wrap it in a {@link Secret} to keep it out of your own logs. */
  readonly apiKey: string | Secret;
  /** API user name (`--equinix-api-username`), sent as `X-Consumer-Token` like packngo does. Optional. */
  readonly apiUsername?: string | undefined;
  /** API base URL (`--equinix-api-url`). Default {@link DEFAULT_EQUINIX_API_URL}. */
  readonly baseUrl?: string | undefined;
  /** Time limit of each attempt, body included. Default 60 s: listing reservations is slow. */
  readonly requestTimeout?: number | undefined;
  /** Requests on the wire at once. Default 4. */
  readonly maxConcurrency?: number | undefined;
  /** Limits the request rate (every attempt takes a token). Default `parseLimiter('100ms,10')`. */
  readonly rateLimiter?: RateLimiter | undefined;
  /** Retry policy; unset fields keep their defaults (6 attempts, 1 s doubling to 30 s). */
  readonly retry?: Partial<RetryPolicy> | undefined;
  /** `per_page` of list requests. Default 250. */
  readonly pageSize?: number | undefined;
  /** Registers the client's metrics (see the README) on this registry. */
  readonly metrics?: Registry | undefined;
  /** `User-Agent` header. Default `bmaas-shepherd-ts`. */
  readonly userAgent?: string | undefined;
}

/** The client's settings after defaults; safe to log (the key is a {@link Secret}). */
export interface EquinixClientSettings {
  readonly baseUrl: string;
  readonly apiKey: Secret;
  readonly apiUsername: string | undefined;
  readonly requestTimeout: number;
  readonly maxConcurrency: number;
  /** The rate limit in flag syntax, e.g. `100ms,10`. */
  readonly rateLimit: string;
  readonly retry: RetryPolicy;
  readonly pageSize: number;
}

/** The device actions the shepherd takes. */
export type DeviceAction = 'reboot' | 'power_on' | 'power_off';

/** Device list filters; the API applies them, and the client checks them again. */
export interface DeviceFilter {
  /** Only devices carrying this tag. */
  readonly tag?: string | undefined;
}

const ROUTES = {
  listDevices: '/projects/{id}/devices',
  createDevice: '/projects/{id}/devices',
  listReservations: '/projects/{id}/hardware-reservations',
  getDevice: '/devices/{id}',
  deviceActions: '/devices/{id}/actions',
  listSshKeys: '/projects/{id}/ssh-keys',
  createSshKey: '/projects/{id}/ssh-keys',
  updateSshKey: '/ssh-keys/{id}',
} as const;

/**
 * A typed client for the parts of the Equinix Metal API the shepherd uses.
 * Lists are followed to their last page; every request waits for a
 * concurrency slot and a rate-limit token, and is retried with backoff on
 * network errors, timeouts, 429 and 5xx (never on other 4xx). Failures are
 * {@link EquinixApiError}, {@link EquinixRequestError} or
 * {@link EquinixResponseError}.
 *
 * @example
 * ```ts
 * const client = new EquinixClient({ apiKey: new Secret(process.env.EQUINIX_API_KEY ?? '') });
 * const devices = await client.listDevices(projectId);
 * ```
 */
export class EquinixClient {
  /** The settings in force (defaults applied). */
  readonly settings: EquinixClientSettings;
  readonly #transport: Transport;

  constructor(options: EquinixClientOptions) {
    const apiKey = options.apiKey instanceof Secret ? options.apiKey : new Secret(options.apiKey);
    if (apiKey.reveal() === '') throw new TypeError('EquinixClient: apiKey must not be empty');
    const baseUrl = (options.baseUrl ?? DEFAULT_EQUINIX_API_URL).replace(/\/+$/, '');
    try {
      new URL(baseUrl);
    } catch {
      throw new TypeError(`EquinixClient: baseUrl ${JSON.stringify(baseUrl)} is not a URL`);
    }
    const requestTimeout = positive('requestTimeout', options.requestTimeout ?? 60_000);
    const maxConcurrency = options.maxConcurrency ?? 4;
    const pageSize = options.pageSize ?? 250;
    if (!Number.isSafeInteger(pageSize) || pageSize < 1) {
      throw new RangeError(`EquinixClient: pageSize must be a positive integer, got ${pageSize}`);
    }
    const rateLimiter = options.rateLimiter ?? parseLimiter('100ms,10');
    const retry = retryPolicy(options.retry);
    this.settings = Object.freeze({
      baseUrl,
      apiKey,
      apiUsername: options.apiUsername,
      requestTimeout,
      maxConcurrency,
      rateLimit: rateLimiter.spec,
      retry,
      pageSize,
    });
    this.#transport = new Transport({
      baseUrl,
      apiKey,
      consumerToken: options.apiUsername,
      requestTimeout,
      concurrency: new Semaphore(maxConcurrency),
      rateLimiter,
      retry,
      metrics: options.metrics && new EquinixApiMetrics(options.metrics),
      userAgent: options.userAgent ?? 'bmaas-shepherd-ts',
    });
  }

  /** Every device of the project (all pages). */
  async listDevices(projectId: string, filter: DeviceFilter = {}, signal?: AbortSignal): Promise<EquinixDevice[]> {
    const devices = await this.#listAll(
      ROUTES.listDevices,
      `/projects/${seg(projectId)}/devices`,
      'devices',
      parseDevice,
      { tag: filter.tag },
      signal,
    );
    const tag = filter.tag;
    return tag === undefined ? devices : devices.filter((device) => device.tags?.includes(tag));
  }

  /** Every hardware reservation of the project (all pages). Slow on big projects. */
  listReservations(projectId: string, signal?: AbortSignal): Promise<EquinixHardwareReservation[]> {
    return this.#listAll(
      ROUTES.listReservations,
      `/projects/${seg(projectId)}/hardware-reservations`,
      'hardware_reservations',
      parseReservation,
      {},
      signal,
    );
  }

  /**
   * One device.
   *
   * @throws {@link EquinixApiError} with status 404 when there is no such device
   */
  getDevice(deviceId: string, signal?: AbortSignal): Promise<EquinixDevice> {
    return this.#request('GET', ROUTES.getDevice, `/devices/${seg(deviceId)}`, {
      repeatable: true,
      parse: (body) => parseDevice(body, 'GET', `/devices/${deviceId}`),
      signal,
    });
  }

  /**
   * Creates a device, at most once. The request carries a fresh
   * `bmaas-create-<uuid>` tag; when an attempt's answer is lost (network
   * error, timeout, 5xx), the client looks for a device with that tag before
   * trying again and returns it if found, so retries never create a second
   * device.
   *
   * @throws {@link ReservationTakenError} when `hardware_reservation_id` was
   *   provisioned by someone else (not retried)
   */
  async createDevice(projectId: string, request: DeviceCreateRequest, signal?: AbortSignal): Promise<EquinixDevice> {
    const tag = `${CREATE_TAG_PREFIX}${randomUUID()}`;
    const path = `/projects/${seg(projectId)}/devices`;
    const findOurs = async (s: AbortSignal | undefined) => (await this.listDevices(projectId, { tag }, s))[0];
    try {
      const device = await this.#request('POST', ROUTES.createDevice, path, {
        body: { ...request, tags: [...(request.tags ?? []), tag] },
        repeatable: false,
        recover: findOurs,
        parse: (body) => parseDevice(body, 'POST', path),
        signal,
      });
      detail.api(
        'created device %s (%s) in project %s on reservation %s',
        device.id,
        device.hostname,
        projectId,
        request.hardware_reservation_id ?? '-',
      );
      return device;
    } catch (error) {
      const reservationId = request.hardware_reservation_id;
      if (!(error instanceof EquinixApiError) || reservationId === undefined || !isReservationTaken(error)) throw error;
      // After a lost answer, the device that took the reservation may be our own.
      const ours = error.attempts > 1 ? await findOurs(signal) : undefined;
      if (ours) return ours;
      throw new ReservationTakenError(reservationId, error.status, error.apiMessage);
    }
  }

  /** Asks the API to reboot a device. A repeated reboot is harmless, so this is retried like a GET. */
  async rebootDevice(deviceId: string, signal?: AbortSignal): Promise<void> {
    await this.deviceAction(deviceId, 'reboot', signal);
  }

  /**
   * Asks the API for a device action (`POST /devices/{id}/actions`):
   * `reboot`, `power_on` or `power_off`. Each is harmless repeated, so it is
   * retried like a GET.
   */
  async deviceAction(deviceId: string, type: DeviceAction, signal?: AbortSignal): Promise<void> {
    await this.#request('POST', ROUTES.deviceActions, `/devices/${seg(deviceId)}/actions`, {
      body: { type },
      repeatable: true,
      parse: () => undefined,
      signal,
    });
  }

  /** The project's SSH keys (all pages). */
  listSshKeys(projectId: string, signal?: AbortSignal): Promise<EquinixSshKey[]> {
    return this.#listAll(
      ROUTES.listSshKeys,
      `/projects/${seg(projectId)}/ssh-keys`,
      'ssh_keys',
      parseSshKey,
      {},
      signal,
    );
  }

  /** Adds an SSH key to the project. After a lost answer, finds the key by label and content instead of adding it twice. */
  createSshKey(projectId: string, key: { label: string; key: string }, signal?: AbortSignal): Promise<EquinixSshKey> {
    const path = `/projects/${seg(projectId)}/ssh-keys`;
    return this.#request('POST', ROUTES.createSshKey, path, {
      body: { label: key.label, key: key.key },
      repeatable: false,
      recover: async (s) =>
        (await this.listSshKeys(projectId, s)).find((k) => k.label === key.label && sameKey(k.key, key.key)),
      parse: (body) => parseSshKey(body, 'POST', path),
      signal,
    });
  }

  /** Replaces an SSH key's label and key. */
  updateSshKey(keyId: string, key: { label: string; key: string }, signal?: AbortSignal): Promise<EquinixSshKey> {
    const path = `/ssh-keys/${seg(keyId)}`;
    return this.#request('PUT', ROUTES.updateSshKey, path, {
      body: { label: key.label, key: key.key },
      repeatable: true,
      parse: (body) => parseSshKey(body, 'PUT', path),
      signal,
    });
  }

  #request<T>(
    method: HttpMethod,
    route: string,
    path: string,
    rest: Omit<ApiRequest<T>, 'method' | 'route' | 'path'>,
  ): Promise<T> {
    return this.#transport.request({ method, route, path, ...rest });
  }

  /** Follows a list to its last page (`meta.next`, `meta.last_page`). */
  async #listAll<T>(
    route: string,
    path: string,
    key: string,
    parseItem: (item: unknown, method: string, path: string) => T,
    query: Record<string, string | undefined>,
    signal: AbortSignal | undefined,
  ): Promise<T[]> {
    const items: T[] = [];
    for (let page = 1; ; ) {
      const { list, meta } = await this.#request('GET', route, path, {
        query: { ...query, page, per_page: this.settings.pageSize },
        repeatable: true,
        parse: (body) => parseList(body, key, 'GET', path),
        signal,
      });
      for (const item of list) items.push(parseItem(item, 'GET', path));
      const next = nextPage(meta, page);
      if (next === undefined || list.length === 0) return items;
      page = next;
    }
  }
}

/** The page after `current`, or `undefined` on the last page. */
export function nextPage(meta: EquinixMeta | undefined, current: number): number | undefined {
  const lastPage = typeof meta?.last_page === 'number' ? meta.last_page : undefined;
  const href = meta?.next?.href;
  let next: number | undefined;
  if (typeof href === 'string' && href !== '') {
    const fromHref = Number(new URL(href, 'http://next.invalid').searchParams.get('page'));
    next = Number.isSafeInteger(fromHref) && fromHref > current ? fromHref : current + 1;
  } else if (lastPage !== undefined && current < lastPage) {
    next = current + 1;
  }
  return next !== undefined && (lastPage === undefined || next <= lastPage) ? next : undefined;
}

/** 409, or 422 about the reservation being in use: someone else got there first. */
function isReservationTaken(error: EquinixApiError): boolean {
  if (error.status === 409) return true;
  return (
    error.status === 422 &&
    /reserv/i.test(error.apiMessage) &&
    /(already|provisioned|in use|taken|not provisionable|unavailable)/i.test(error.apiMessage)
  );
}

function positive(name: string, value: number): number {
  if (!(value > 0) || !Number.isFinite(value)) {
    throw new RangeError(`EquinixClient: ${name} must be a positive duration in ms, got ${value}`);
  }
  return value;
}

function seg(id: string): string {
  return encodeURIComponent(id);
}

function object(body: unknown, method: string, path: string, what: string): Record<string, unknown> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new EquinixResponseError(method, path, `${what} is not a JSON object`);
  }
  return body as Record<string, unknown>;
}

function parseList(
  body: unknown,
  key: string,
  method: string,
  path: string,
): { list: unknown[]; meta: EquinixMeta | undefined } {
  const page = object(body, method, path, 'the page');
  const list = page[key];
  if (!Array.isArray(list)) throw new EquinixResponseError(method, path, `the page has no "${key}" array`);
  const meta = page.meta;
  return { list, meta: typeof meta === 'object' && meta !== null ? (meta as EquinixMeta) : undefined };
}

function requireStrings(record: Record<string, unknown>, keys: readonly string[], method: string, path: string) {
  for (const key of keys) {
    if (typeof record[key] !== 'string') {
      throw new EquinixResponseError(method, path, `"${key}" is missing or not a string`);
    }
  }
}

function parseDevice(body: unknown, method: string, path: string): EquinixDevice {
  const device = object(body, method, path, 'a device');
  requireStrings(device, ['id', 'hostname', 'state'], method, path);
  return device as unknown as EquinixDevice;
}

function parseReservation(body: unknown, method: string, path: string): EquinixHardwareReservation {
  const reservation = object(body, method, path, 'a hardware reservation');
  requireStrings(reservation, ['id'], method, path);
  if (typeof reservation.provisionable !== 'boolean') {
    throw new EquinixResponseError(method, path, `reservation ${reservation.id} has no "provisionable" flag`);
  }
  const plan = reservation.plan as { slug?: unknown } | null | undefined;
  if (typeof plan?.slug !== 'string') {
    throw new EquinixResponseError(method, path, `reservation ${reservation.id} has no plan slug`);
  }
  return reservation as unknown as EquinixHardwareReservation;
}

function parseSshKey(body: unknown, method: string, path: string): EquinixSshKey {
  const key = object(body, method, path, 'an SSH key');
  requireStrings(key, ['id', 'label', 'key'], method, path);
  return key as unknown as EquinixSshKey;
}
