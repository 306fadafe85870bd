import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describeError } from '@bmaas/common';
import type { EquinixDevice, EquinixHardwareReservation, EquinixSshKey } from '../api/types.js';
import { log } from '../internal/log.js';
import { type FakeDeviceSeed, type FakeReservationSeed, FakeStore } from './fake-store.js';
import { type FakeFault, FaultQueue, sendFault } from './faults.js';
import { addSshKey, answerRequest, type FakeProject } from './handlers.js';
import { parseBody, readBody, send } from './http.js';
import { type FakeRequest, type FakeRoute, isKnownPath, matchRoute, NOT_FOUND } from './routes.js';

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
  readonly #faults = new FaultQueue();
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
    private readonly project: FakeProject,
  ) {
    this.#server = server;
    this.#store = project.store;
  }

  /** Starts the fake on a free port of 127.0.0.1. */
  static async start(options: FakeEquinixApiOptions = {}): Promise<FakeEquinixApi> {
    const basePath = (options.basePath ?? '/metal/v1').replace(/\/+$/, '');
    const projectId = options.projectId ?? randomUUID();
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
      projectId,
      { store, projectId, basePath, defaultPageSize: options.defaultPageSize ?? 10 },
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
    return addSshKey(this.#store, key);
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

  /**
   * Device actions the API accepted for a device, oldest first. `power_off`
   * makes the device `inactive`, `power_on` makes an inactive one `active`.
   */
  actions(id: string): readonly string[] {
    return this.#store.actions(id);
  }

  /** Makes the next `fault.times` (default 1) calls of `route` fail as described. Faults queue up per route. */
  fail(route: FakeRoute, fault: FakeFault): void {
    this.#faults.add(route, fault);
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
      const path = url.pathname.startsWith(`${this.project.basePath}/`)
        ? url.pathname.slice(this.project.basePath.length)
        : url.pathname;
      const match = matchRoute(req.method, path);
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

      const fault = match && this.#faults.take(match.route);
      if (fault?.delay) await this.#delay(fault.delay);
      if (res.destroyed) return;
      if (!authenticated) return send(res, { status: 401, body: { error: 'Invalid authentication token' } });
      if (!match) {
        return send(res, isKnownPath(path) ? { status: 405, body: { errors: ['Method not allowed'] } } : NOT_FOUND);
      }
      if (fault?.status !== undefined && !fault.afterProcessing) return sendFault(res, fault);

      const answer = answerRequest(this.project, match.route, match.id, request);
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

  #delay(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#timers.delete(timer);
        resolve();
      }, ms);
      this.#timers.add(timer);
    });
  }
}
