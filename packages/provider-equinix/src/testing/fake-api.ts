import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describeError } from '@bmaas/bmdb-controlloop';
import type { EquinixDevice, EquinixHardwareReservation, EquinixSshKey } from '../api/types.js';
import { log } from '../internal/log.js';
import { type FakeDeviceSeed, type FakeReservationSeed, FakeStore } from './fake-store.js';

/** The calls the fake API implements, named `METHOD /path/{template}`. */
export type FakeRoute =
  | 'GET /projects/{id}/devices'
  | 'POST /projects/{id}/devices'
  | 'GET /projects/{id}/hardware-reservations'
  | 'GET /devices/{id}'
  | 'POST /devices/{id}/actions'
  | 'GET /projects/{id}/ssh-keys'
  | 'POST /projects/{id}/ssh-keys'
  | 'PUT /ssh-keys/{id}';

/** Options for {@link FakeEquinixApi.start}. */
export interface FakeEquinixApiOptions {
  /** The only API key accepted (`X-Auth-Token`). Default a random UUID. */
  readonly apiKey?: string;
  /** The project's ID. Default a random UUID. */
  readonly projectId?: string;
  /** Seeds this many free, provisionable reservations. Default 0. */
  readonly reservations?: number;
  /** Seeds these devices (after the reservations). */
  readonly devices?: readonly FakeDeviceSeed[];
  /** Plan of seeded reservations and devices. Default `m3.large.x86`. */
  readonly plan?: string;
  /** Default `da11`. */
  readonly facility?: string;
  /** Default `da`. */
  readonly metro?: string;
  /** Path prefix of the API. Default `/metal/v1`. */
  readonly basePath?: string;
  /**
   * Reads (GET or listing) a new device answers as `provisioning` before it
   * turns `active` and gets addresses. Default 1; `Infinity` to keep it
   * provisioning until {@link FakeEquinixApi.activate}.
   */
  readonly provisioningReads?: number;
  /** `per_page` when the request gives none. Default 10 (as the real API). */
  readonly defaultPageSize?: number;
  /**
   * Public IPv4 every device gets when it is addressed, instead of one from
   * 198.18.0.0/15 (never routed) each: `127.0.0.1` lets a test's SSH server
   * stand in for the devices.
   */
  readonly publicIpv4?: string;
}

/**
 * A failure to inject into the next calls of a route. Without `status`,
 * `drop` or `malformed` the call is only delayed.
 */
export interface FakeFault {
  /** Answer with this HTTP status instead of handling the call. */
  readonly status?: number;
  /** JSON body of the `status` answer. Default `{"errors": ["injected failure"]}`. */
  readonly body?: unknown;
  /** `Retry-After` header of the `status` answer (seconds or an HTTP date). */
  readonly retryAfter?: string | number;
  /** With `status`: handle the call first (its change happens), then answer with `status`. */
  readonly afterProcessing?: boolean;
  /** Handle the call, then close the connection without answering (a lost answer). */
  readonly drop?: boolean;
  /** Handle the call, then answer 200 with a truncated JSON body. */
  readonly malformed?: boolean;
  /** Wait this long (ms) before doing anything. */
  readonly delay?: number;
  /** How many calls the fault applies to. Default 1. */
  readonly times?: number;
}

/** A call the fake API received. The API key is never recorded. */
export interface FakeRequest {
  readonly method: string;
  /** Path without the base path: `/projects/…/devices`. */
  readonly path: string;
  /** The route it matched, if any. */
  readonly route: FakeRoute | undefined;
  readonly query: Readonly<Record<string, string>>;
  /** Parsed JSON body (the raw text if it was not JSON; `undefined` without a body). */
  readonly body: unknown;
  /** Whether it carried the right API key. */
  readonly authenticated: boolean;
}

interface Answer {
  readonly status: number;
  readonly body?: unknown;
}

interface ActiveFault {
  readonly fault: FakeFault;
  left: number;
}

const ROUTES: ReadonlyArray<{ route: FakeRoute; method: string; pattern: RegExp }> = [
  { route: 'GET /projects/{id}/devices', method: 'GET', pattern: /^\/projects\/([^/]+)\/devices$/ },
  { route: 'POST /projects/{id}/devices', method: 'POST', pattern: /^\/projects\/([^/]+)\/devices$/ },
  {
    route: 'GET /projects/{id}/hardware-reservations',
    method: 'GET',
    pattern: /^\/projects\/([^/]+)\/hardware-reservations$/,
  },
  { route: 'GET /devices/{id}', method: 'GET', pattern: /^\/devices\/([^/]+)$/ },
  { route: 'POST /devices/{id}/actions', method: 'POST', pattern: /^\/devices\/([^/]+)\/actions$/ },
  { route: 'GET /projects/{id}/ssh-keys', method: 'GET', pattern: /^\/projects\/([^/]+)\/ssh-keys$/ },
  { route: 'POST /projects/{id}/ssh-keys', method: 'POST', pattern: /^\/projects\/([^/]+)\/ssh-keys$/ },
  { route: 'PUT /ssh-keys/{id}', method: 'PUT', pattern: /^\/ssh-keys\/([^/]+)$/ },
];

const NOT_FOUND: Answer = { status: 404, body: { errors: ['Not found'] } };

/**
 * A fake Equinix Metal API on 127.0.0.1 for tests: one project with devices,
 * hardware reservations and SSH keys, the API's JSON shapes and pagination,
 * `X-Auth-Token` checking, devices created from reservations (provisioning,
 * then active), every request recorded, and failures on demand.
 *
 * @example
 * ```ts
 * const api = await FakeEquinixApi.start({ reservations: 3 });
 * const client = new EquinixClient({ apiKey: api.apiKey, baseUrl: api.url });
 * api.fail('POST /projects/{id}/devices', { drop: true }); // the next create's answer is lost
 * // ...
 * await api.close();
 * ```
 */
export class FakeEquinixApi {
  /** Every call received, oldest first. */
  readonly requests: FakeRequest[] = [];
  readonly #server: Server;
  readonly #store: FakeStore;
  readonly #faults = new Map<FakeRoute, ActiveFault[]>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #inFlight = 0;
  #maxInFlight = 0;

  private constructor(
    server: Server,
    /** Base URL to give the client, e.g. `http://127.0.0.1:41234/metal/v1`. */
    readonly url: string,
    /** The API key the fake accepts. */
    readonly apiKey: string,
    readonly projectId: string,
    private readonly options: Required<Pick<FakeEquinixApiOptions, 'basePath' | 'defaultPageSize'>>,
    store: FakeStore,
  ) {
    this.#server = server;
    this.#store = store;
  }

  /** Starts the fake on a free port of 127.0.0.1. */
  static async start(options: FakeEquinixApiOptions = {}): Promise<FakeEquinixApi> {
    const basePath = (options.basePath ?? '/metal/v1').replace(/\/+$/, '');
    const store = new FakeStore({
      plan: options.plan ?? 'm3.large.x86',
      facility: options.facility ?? 'da11',
      metro: options.metro ?? 'da',
      basePath,
      provisioningReads: options.provisioningReads ?? 1,
      publicIpv4: options.publicIpv4,
    });
    for (let i = 0; i < (options.reservations ?? 0); i++) store.addReservation();
    for (const seed of options.devices ?? []) store.addDevice(seed);
    // The handler is attached below: it needs the instance.
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const { port } = server.address() as AddressInfo;
    const api = new FakeEquinixApi(
      server,
      `http://127.0.0.1:${port}${basePath}`,
      options.apiKey ?? randomUUID(),
      options.projectId ?? randomUUID(),
      { basePath, defaultPageSize: options.defaultPageSize ?? 10 },
      store,
    );
    server.on('request', (req, res) => void api.#handle(req, res));
    log.fake('fake Equinix API for project %s listening at %s', api.projectId, api.url);
    return api;
  }

  /** Every device, as the API would show it (without counting as a read). */
  get devices(): EquinixDevice[] {
    return [...this.#store.devices.values()].map((device) => this.#store.renderDevice(device));
  }

  /** Every hardware reservation, as the API would show it. */
  get reservations(): EquinixHardwareReservation[] {
    return [...this.#store.reservations.values()].map((reservation) => this.#store.renderReservation(reservation));
  }

  get sshKeys(): EquinixSshKey[] {
    return [...this.#store.sshKeys.values()];
  }

  /** Most calls the fake was handling at once. */
  get maxConcurrentRequests(): number {
    return this.#maxInFlight;
  }

  /** One device as the API would show it, or `undefined`. */
  device(id: string): EquinixDevice | undefined {
    const device = this.#store.devices.get(id);
    return device && this.#store.renderDevice(device);
  }

  addReservation(seed: FakeReservationSeed = {}): EquinixHardwareReservation {
    return this.#store.addReservation(seed);
  }

  addReservations(count: number, seed: FakeReservationSeed = {}): EquinixHardwareReservation[] {
    return Array.from({ length: count }, () => this.#store.addReservation({ ...seed, id: undefined }));
  }

  addDevice(seed: FakeDeviceSeed): EquinixDevice {
    return this.#store.addDevice(seed);
  }

  addSshKey(key: { label: string; key: string }): EquinixSshKey {
    const stored = { id: randomUUID(), label: key.label, key: key.key, fingerprint: fingerprint(key.key) };
    this.#store.sshKeys.set(stored.id, stored);
    return stored;
  }

  /** Deletes a device: the API answers 404 for it, and its reservation is free again. */
  removeDevice(id: string): void {
    this.#store.removeDevice(id);
  }

  setDeviceState(id: string, state: string): void {
    this.#store.setDeviceState(id, state);
  }

  /** Turns a provisioning device active now. */
  activate(id: string): void {
    this.setDeviceState(id, 'active');
  }

  /** Reboots the API accepted for a device. */
  reboots(id: string): number {
    return this.#store.reboots(id);
  }

  /** Makes the next `fault.times` (default 1) calls of `route` fail as described. Faults queue up per route. */
  fail(route: FakeRoute, fault: FakeFault): void {
    const queue = this.#faults.get(route) ?? [];
    queue.push({ fault, left: fault.times ?? 1 });
    this.#faults.set(route, queue);
  }

  /** Drops every pending fault. */
  clearFaults(): void {
    this.#faults.clear();
  }

  /** The calls received for one route. */
  requestsTo(route: FakeRoute): FakeRequest[] {
    return this.requests.filter((request) => request.route === route);
  }

  /** Stops the server, cutting open connections. */
  async close(): Promise<void> {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    this.#server.closeAllConnections();
    await closed;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.#inFlight++;
    this.#maxInFlight = Math.max(this.#maxInFlight, this.#inFlight);
    try {
      const url = new URL(req.url ?? '/', 'http://fake.invalid');
      const text = await readBody(req);
      const path = url.pathname.startsWith(`${this.options.basePath}/`)
        ? url.pathname.slice(this.options.basePath.length)
        : url.pathname;
      const match = ROUTES.find((r) => r.method === req.method && r.pattern.test(path));
      const authenticated = req.headers['x-auth-token'] === this.apiKey;
      const request: FakeRequest = {
        method: req.method ?? 'GET',
        path,
        route: match?.route,
        query: Object.fromEntries(url.searchParams),
        body: parseBody(text),
        authenticated,
      };
      this.requests.push(request);

      const fault = match && this.#takeFault(match.route);
      if (fault?.delay) await this.#delay(fault.delay);
      if (res.destroyed) return;
      if (!authenticated) return send(res, { status: 401, body: { error: 'Invalid authentication token' } });
      if (!match) {
        const known = ROUTES.some((r) => r.pattern.test(path));
        return send(res, known ? { status: 405, body: { errors: ['Method not allowed'] } } : NOT_FOUND);
      }
      if (fault?.status !== undefined && !fault.afterProcessing) return sendFault(res, fault);

      const id = decodeURIComponent(match.pattern.exec(path)?.[1] ?? '');
      const answer = this.#route(match.route, id, request);
      log.fake('%s %s -> %d', request.method, path, answer.status);

      if (fault?.drop) {
        // The change happened; the client never learns of it.
        res.socket?.destroy();
        return;
      }
      if (fault?.malformed) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"devices": [{"id": ');
        return;
      }
      if (fault?.status !== undefined) return sendFault(res, fault);
      send(res, answer);
    } catch (error) {
      log.fake('handler failed: %s', describeError(error));
      if (!res.headersSent && !res.destroyed) send(res, { status: 500, body: { errors: ['fake API bug'] } });
    } finally {
      this.#inFlight--;
    }
  }

  #takeFault(route: FakeRoute): FakeFault | undefined {
    const queue = this.#faults.get(route);
    const active = queue?.[0];
    if (!queue || !active) return undefined;
    if (--active.left <= 0) queue.shift();
    return active.fault;
  }

  #delay(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#timers.delete(timer);
        resolve();
      }, ms);
      this.#timers.add(timer);
    });
  }

  #route(route: FakeRoute, id: string, request: FakeRequest): Answer {
    const store = this.#store;
    switch (route) {
      case 'GET /projects/{id}/devices': {
        if (id !== this.projectId) return NOT_FOUND;
        const { tag, hostname } = request.query;
        const devices = [...store.devices.values()].filter(
          (d) => (tag === undefined || d.tags.includes(tag)) && (hostname === undefined || d.hostname === hostname),
        );
        return this.#page(request, 'devices', devices, (d) => store.read(d));
      }
      case 'GET /projects/{id}/hardware-reservations': {
        if (id !== this.projectId) return NOT_FOUND;
        const reservations = [...store.reservations.values()];
        return this.#page(request, 'hardware_reservations', reservations, (r) => store.renderReservation(r));
      }
      case 'GET /devices/{id}': {
        const device = store.devices.get(id);
        return device ? { status: 200, body: store.read(device) } : NOT_FOUND;
      }
      case 'POST /projects/{id}/devices':
        return id === this.projectId ? this.#createDevice(request.body) : NOT_FOUND;
      case 'POST /devices/{id}/actions': {
        const device = store.devices.get(id);
        if (!device) return NOT_FOUND;
        const type = (request.body as { type?: unknown } | undefined)?.type;
        if (!['reboot', 'power_on', 'power_off', 'reinstall'].includes(String(type))) {
          return unprocessable(`unknown action type ${JSON.stringify(type)}`);
        }
        if (type === 'reboot') device.reboots++;
        return { status: 202 };
      }
      case 'GET /projects/{id}/ssh-keys':
        if (id !== this.projectId) return NOT_FOUND;
        return this.#page(request, 'ssh_keys', [...store.sshKeys.values()], (k) => k);
      case 'POST /projects/{id}/ssh-keys': {
        if (id !== this.projectId) return NOT_FOUND;
        const { label, key } = (request.body ?? {}) as { label?: unknown; key?: unknown };
        if (typeof label !== 'string' || label === '') return unprocessable('label is required');
        if (typeof key !== 'string' || key === '') return unprocessable('key is required');
        return { status: 201, body: this.addSshKey({ label, key }) };
      }
      case 'PUT /ssh-keys/{id}': {
        const existing = store.sshKeys.get(id);
        if (!existing) return NOT_FOUND;
        const { label, key } = (request.body ?? {}) as { label?: unknown; key?: unknown };
        const updated = {
          ...existing,
          label: typeof label === 'string' ? label : existing.label,
          key: typeof key === 'string' ? key : existing.key,
        };
        updated.fingerprint = fingerprint(updated.key);
        store.sshKeys.set(id, updated);
        return { status: 200, body: updated };
      }
    }
  }

  #createDevice(body: unknown): Answer {
    const request = (body ?? {}) as Record<string, unknown>;
    const { hostname, plan, operating_system: os, hardware_reservation_id: reservationId } = request;
    if (typeof hostname !== 'string' || hostname === '') return unprocessable('hostname is required');
    if (typeof plan !== 'string' || plan === '') return unprocessable('plan is required');
    if (typeof os !== 'string' || os === '') return unprocessable('operating_system is required');
    const keys = request.project_ssh_keys;
    if (keys !== undefined) {
      if (!Array.isArray(keys)) return unprocessable('project_ssh_keys must be a list');
      const unknown = keys.find((key) => !this.#store.sshKeys.has(String(key)));
      if (unknown !== undefined) return unprocessable(`project SSH key ${String(unknown)} does not exist`);
    }
    const tags = Array.isArray(request.tags) ? request.tags.map(String) : [];
    if (reservationId !== undefined) {
      const reservation = this.#store.reservations.get(String(reservationId));
      if (!reservation) return unprocessable(`hardware reservation ${String(reservationId)} was not found`);
      if (reservation.deviceId !== undefined || !reservation.provisionable) {
        return unprocessable(`Hardware reservation ${reservation.id} is already provisioned with a device`);
      }
      if (reservation.plan !== plan) {
        return unprocessable(
          `plan ${plan} does not match hardware reservation ${reservation.id} (${reservation.plan})`,
        );
      }
    }
    const device = this.#store.addDevice({
      hostname,
      plan,
      tags,
      state: 'provisioning',
      reservationId: reservationId === undefined ? undefined : String(reservationId),
    });
    return { status: 201, body: device };
  }

  #page<T>(request: FakeRequest, key: string, all: readonly T[], render: (item: T) => unknown): Answer {
    const perPage = clampInt(request.query.per_page, this.options.defaultPageSize, 1, 1000);
    const lastPage = Math.max(1, Math.ceil(all.length / perPage));
    const page = clampInt(request.query.page, 1, 1, Number.MAX_SAFE_INTEGER);
    const items = all.slice((page - 1) * perPage, page * perPage).map(render);
    const href = (p: number) => {
      const query = new URLSearchParams({ ...request.query, page: String(p), per_page: String(perPage) });
      return { href: `${this.options.basePath}${request.path}?${query}` };
    };
    return {
      status: 200,
      body: {
        [key]: items,
        meta: {
          first: href(1),
          previous: page > 1 ? href(page - 1) : null,
          self: href(page),
          next: page < lastPage ? href(page + 1) : null,
          last: href(lastPage),
          current_page: page,
          last_page: lastPage,
          total: all.length,
        },
      },
    };
  }
}

function unprocessable(message: string): Answer {
  return { status: 422, body: { errors: [message] } };
}

function send(res: ServerResponse, answer: Answer): void {
  if (answer.body === undefined) {
    res.writeHead(answer.status);
    res.end();
    return;
  }
  res.writeHead(answer.status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(answer.body));
}

function sendFault(res: ServerResponse, fault: FakeFault): void {
  const status = fault.status ?? 500;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (fault.retryAfter !== undefined) headers['retry-after'] = String(fault.retryAfter);
  res.writeHead(status, headers);
  res.end(JSON.stringify(fault.body ?? { errors: ['injected failure'] }));
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function parseBody(text: string): unknown {
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function clampInt(text: string | undefined, fallback: number, min: number, max: number): number {
  const value = Number(text);
  if (text === undefined || !Number.isSafeInteger(value)) return fallback;
  return Math.min(max, Math.max(min, value));
}

function fingerprint(key: string): string {
  return key.trim().split(/\s+/)[1]?.slice(0, 16) ?? '';
}
