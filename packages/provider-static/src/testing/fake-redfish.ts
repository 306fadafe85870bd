import { timingSafeEqual } from 'node:crypto';
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { describeError } from '@bmaas/common';
import { log } from '../internal/log.js';
import {
  FAKE_BOOT_SOURCES,
  type FakeBootSource,
  type FakePowerBackend,
  FakePowerRefusal,
  type FakePowerState,
  SimulatedPower,
} from './fake-power.js';

/** A ComputerSystem of the fake BMC. */
export interface FakeSystemOptions {
  /**
   * `ResetType@Redfish.AllowableValues` of its reset action. Default
   * `['On', 'ForceOff', 'GracefulShutdown', 'GracefulRestart', 'ForceRestart', 'PowerCycle']`;
   * `null` to leave the list out.
   */
  readonly allowableResetTypes?: readonly string[] | null;
  /** Lists the allowable values in an ActionInfo resource instead of on the action. */
  readonly actionInfo?: boolean;
  /** `false`: the system has no `#ComputerSystem.Reset` action. Default true. */
  readonly resetAction?: boolean;
  /** The simulated power at start. Default `On`. */
  readonly powerState?: 'On' | 'Off';
  /** How long a simulated power change takes, in ms (`PoweringOn`/`PoweringOff` meanwhile). Default 0. */
  readonly powerTransition?: number;
  /** Leave `PowerState` out of the ComputerSystem, as some BMCs do. */
  readonly omitPowerState?: boolean;
  /** Drive this backend instead of simulated power (a VM, say); `powerState` and `powerTransition` then do nothing. */
  readonly power?: FakePowerBackend;
  /**
   * Where its virtual media is: `manager`, under the Manager the system
   * links in `Links.ManagedBy` (as iDRAC keeps it; the default); `system`,
   * its own `VirtualMedia` collection; `none`, a BMC without virtual media.
   * Either collection has a `RemovableDisk` (USBStick) and a `CD` (CD, DVD).
   */
  readonly virtualMedia?: 'manager' | 'system' | 'none';
  /** `Boot.BootSourceOverrideMode` at start. Default `UEFI`; `null` for a BMC without the property. */
  readonly bootMode?: 'UEFI' | 'Legacy' | null;
  /**
   * PATCHes of its boot override to answer 204 and drop, as iDRAC,
   * Supermicro and others now and then do. Default 0.
   */
  readonly ignoreBootOverrides?: number;
  /** The boot override targets it allows (`BootSourceOverrideTarget@Redfish.AllowableValues`). Default all of {@link FAKE_BOOT_SOURCES}. */
  readonly bootSources?: readonly FakeBootSource[];
  /**
   * Refuse a PATCH without `If-Match` naming the system's current `ETag`
   * (428, or 412 for a stale one), as Supermicro's BMCs do. The fake sends
   * an `ETag` with every read of a system either way.
   */
  readonly requireIfMatch?: boolean;
  /** Refuse every InsertMedia (400), naming the image as iDRAC does: it could not reach it. */
  readonly refuseInsertMedia?: boolean;
}

/** A system's CD virtual media, as last inserted or ejected. */
export interface FakeVirtualMedia {
  readonly inserted: boolean;
  readonly image: string | undefined;
  readonly writeProtected: boolean | undefined;
  readonly transferProtocolType: string | undefined;
}

/** A failure to inject into the next requests for a system. Without `status` or `drop` the request is only delayed. */
export interface FakeRedfishFault {
  /** Answer with this HTTP status (401, 500, 503, …) instead of handling the request. */
  readonly status?: number;
  /** The Redfish error message answered with `status`. Default `injected HTTP <status>`. */
  readonly message?: string;
  /** Close the connection without answering. */
  readonly drop?: boolean;
  /** Wait this long (ms) before doing anything: a slow BMC. */
  readonly delay?: number;
  /** Wait until this settles before doing anything: a BMC as slow as the test wants. */
  readonly until?: Promise<unknown>;
  /**
   * Do what was asked first (the reset happens), then wait and drop or
   * answer: a BMC that acted but answered late, or never. A wait ends early
   * when the client hangs up.
   */
  readonly afterActing?: boolean;
  /** Only requests of this method. Default both. */
  readonly method?: 'GET' | 'POST';
  /** How many requests the fault applies to. Default 1. */
  readonly times?: number;
}

/** A reset the fake accepted. */
export interface FakeReset {
  readonly system: string;
  readonly resetType: string;
  readonly at: Date;
}

/** A request the fake received. Passwords are never recorded. */
export interface FakeRedfishRequest {
  readonly method: string;
  readonly path: string;
  readonly system: string | undefined;
  /** The basic-auth user name, if any. */
  readonly username: string | undefined;
  /** The status it answered (0: dropped). */
  status: number;
}

/** Options of {@link FakeRedfishServer.start}. */
export interface FakeRedfishServerOptions {
  /** Serve HTTPS with this key and certificate (PEM); plain HTTP without. */
  readonly tls?: { readonly key: string | Buffer; readonly cert: string | Buffer } | undefined;
  /** The one user name accepted. Default `admin`. */
  readonly username?: string;
  /** Its password. Default `secret`. */
  readonly password?: string;
  /** Address to listen on. Default 127.0.0.1. */
  readonly host?: string;
}

interface SystemState {
  readonly id: string;
  options: FakeSystemOptions;
  power: FakePowerBackend;
  boot: FakeBootOverride;
  /** Boot override PATCHes still to drop. */
  ignoreOverrides: number;
  /** The CD's; the RemovableDisk is never inserted. */
  cd: FakeVirtualMedia;
  /** What the BMC was told, in its words, oldest first. */
  readonly told: string[];
  /** Bumped by each PATCH kept: the system's ETag. */
  version: number;
}

/** A system's boot source override (`Boot` of the ComputerSystem), as last PATCHed. */
export interface FakeBootOverride {
  readonly target: FakeBootSource;
  readonly enabled: 'Disabled' | 'Once' | 'Continuous';
  /** `BootSourceOverrideMode`; `undefined` for a BMC without it. */
  readonly mode: 'UEFI' | 'Legacy' | undefined;
}

const BOOT_MODES = ['UEFI', 'Legacy'] as const;
/** The virtual media of each collection: what iDRAC has. */
const MEDIA: Readonly<Record<string, readonly string[]>> = { RemovableDisk: ['USBStick'], CD: ['CD', 'DVD'] };
const EJECTED: FakeVirtualMedia = {
  inserted: false,
  image: undefined,
  writeProtected: undefined,
  transferProtocolType: undefined,
};

const BOOT_ENABLED = ['Disabled', 'Once', 'Continuous'] as const;

interface PendingFault extends FakeRedfishFault {
  remaining: number;
}

const DEFAULT_ALLOWABLE = ['On', 'ForceOff', 'GracefulShutdown', 'GracefulRestart', 'ForceRestart', 'PowerCycle'];

/**
 * A fake BMC speaking just enough Redfish for power control, over real
 * HTTP or HTTPS on 127.0.0.1: several ComputerSystems under
 * `/redfish/v1/Systems/<id>` (a Dell-style `System.Embedded.1` among them,
 * if you like) and their collection, HTTP basic authentication, each
 * system's power (simulated, with transitions that take time, or another
 * {@link FakePowerBackend}; `PowerState` left out if asked), faults to
 * inject (401, 5xx, slow answers, dropped connections, a missing reset
 * action, odd allowable values) and a record of the resets it accepted.
 *
 * Reset types drive the power: `On`/`ForceOn` on, `ForceOff` off,
 * `GracefulShutdown` a graceful off, `ForceRestart`/`GracefulRestart`/
 * `PowerCycle` a restart (answered 409 for a system that is off, as many
 * BMCs do), `PushPowerButton` toggles; others are accepted and do nothing.
 *
 * For an agent boot each system has virtual media (under its Manager,
 * `/redfish/v1/Managers/<id>`, or its own; or none) with `InsertMedia` and
 * `EjectMedia` actions (an insert over inserted media is refused, 409, as
 * iDRAC refuses it), and a boot override (`Boot`) that is kept and read
 * back, or dropped the first times if asked. {@link FakeRedfishServer.told}
 * lists what each system was told, in order.
 *
 * @example
 * ```ts
 * const bmc = await FakeRedfishServer.start();
 * bmc.addSystem('node1');
 * // …point a RedfishClient at bmc.systemUrl('node1') with bmc.username / bmc.password…
 * console.log(bmc.resets); // [{ system: 'node1', resetType: 'ForceRestart', at: … }]
 * await bmc.close();
 * ```
 */
export class FakeRedfishServer {
  /** Base URL, `http(s)://127.0.0.1:<port>`. */
  readonly url: string;
  readonly username: string;
  readonly password: string;
  readonly #server: Server;
  readonly #systems = new Map<string, SystemState>();
  readonly #faults = new Map<string, PendingFault[]>();
  readonly #resets: FakeReset[] = [];
  readonly #requests: FakeRedfishRequest[] = [];
  readonly #sockets = new Set<Socket>();
  #inFlight = 0;
  #peak = 0;

  private constructor(server: Server, url: string, username: string, password: string) {
    this.#server = server;
    this.url = url;
    this.username = username;
    this.password = password;
  }

  /** Starts a fake BMC on a free port. Close it in the test's teardown. */
  static async start(options: FakeRedfishServerOptions = {}): Promise<FakeRedfishServer> {
    let fake: FakeRedfishServer | undefined;
    const handler = (req: IncomingMessage, res: ServerResponse) => {
      fake?.handle(req, res).catch((error: unknown) => {
        log.fake('handler failed: %s', describeError(error));
        if (!res.headersSent) res.writeHead(500).end();
      });
    };
    const server = options.tls ? createHttpsServer({ ...options.tls }, handler) : createHttpServer(handler);
    const host = options.host ?? '127.0.0.1';
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, host, () => resolve());
    });
    const { port } = server.address() as AddressInfo;
    const scheme = options.tls ? 'https' : 'http';
    fake = new FakeRedfishServer(
      server,
      `${scheme}://${host.includes(':') ? `[${host}]` : host}:${port}`,
      options.username ?? 'admin',
      options.password ?? 'secret',
    );
    const sockets = fake.#sockets;
    server.on(options.tls ? 'secureConnection' : 'connection', (socket: Socket) => {
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
    });
    return fake;
  }

  /** Adds (or replaces) a ComputerSystem; returns its URL. */
  addSystem(id: string, options: FakeSystemOptions = {}): string {
    const power = options.power ?? new SimulatedPower(options.powerState ?? 'On', options.powerTransition ?? 0);
    const mode = options.bootMode === undefined ? 'UEFI' : (options.bootMode ?? undefined);
    this.#systems.set(id, {
      id,
      options,
      power,
      boot: { target: 'None', enabled: 'Disabled', mode },
      ignoreOverrides: options.ignoreBootOverrides ?? 0,
      cd: EJECTED,
      told: [],
      version: 1,
    });
    return this.systemUrl(id);
  }

  /**
   * Changes a system's reset action, allowable values, `PowerState`
   * reporting, virtual media or overrides to drop; its power, boot override
   * and inserted media stay as they are.
   */
  configureSystem(id: string, options: FakeSystemOptions): void {
    const system = this.#system(id);
    system.options = options;
    system.ignoreOverrides = options.ignoreBootOverrides ?? 0;
  }

  /** A system's CD virtual media now. */
  virtualMedia(id: string): FakeVirtualMedia {
    return this.#system(id).cd;
  }

  /**
   * What system `id` was told, oldest first: `InsertMedia <image> (<type>)`,
   * `EjectMedia`, `BootOverride <target> <enabled> <mode>` (with `ignored`
   * when dropped), `Reset <type>`.
   */
  told(id: string): string[] {
    return [...this.#system(id).told];
  }

  /** A system's boot source override, as last set through a PATCH of its `Boot`. */
  bootOverride(id: string): FakeBootOverride {
    return this.#system(id).boot;
  }

  /** A system's power state now, whether or not the BMC reports it. */
  powerState(id: string): Promise<FakePowerState> {
    return this.#system(id).power.state();
  }

  #system(id: string): SystemState {
    const system = this.#systems.get(id);
    if (!system) throw new Error(`fake Redfish: no system ${id}`);
    return system;
  }

  /** The ComputerSystem URL of system `id`. */
  systemUrl(id: string): string {
    return `${this.url}/redfish/v1/Systems/${encodeURIComponent(id)}`;
  }

  /** Injects `fault` into the next requests for system `id` (`*`: any system). */
  fail(id: string, fault: FakeRedfishFault): void {
    const list = this.#faults.get(id) ?? [];
    list.push({ ...fault, remaining: fault.times ?? 1 });
    this.#faults.set(id, list);
  }

  /** Drops every pending fault. */
  clearFaults(): void {
    this.#faults.clear();
  }

  /** Resets accepted so far, oldest first. */
  get resets(): readonly FakeReset[] {
    return [...this.#resets];
  }

  /** Resets accepted for one system. */
  resetsOf(id: string): FakeReset[] {
    return this.#resets.filter((reset) => reset.system === id);
  }

  /** Requests received so far, oldest first. */
  get requests(): readonly FakeRedfishRequest[] {
    return [...this.#requests];
  }

  /** Most requests the fake was handling at once since start or the last {@link FakeRedfishServer.resetPeak}. */
  get peakConcurrency(): number {
    return this.#peak;
  }

  resetPeak(): void {
    this.#peak = this.#inFlight;
  }

  /** Stops listening and cuts open connections. */
  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const method = req.method ?? 'GET';
    const path = new URL(req.url ?? '/', 'http://fake').pathname.replace(/(.)\/$/, '$1');
    // A system and its Manager share an ID; faults apply to both.
    const match = /^\/redfish\/v1\/(Systems|Managers)\/([^/]+)(\/.*)?$/.exec(path);
    const systemId = match?.[2] === undefined ? undefined : decodeURIComponent(match[2]);
    const credentials = basicAuth(req.headers.authorization);
    const record: FakeRedfishRequest = { method, path, system: systemId, username: credentials?.username, status: 0 };
    this.#requests.push(record);
    this.#inFlight++;
    this.#peak = Math.max(this.#peak, this.#inFlight);
    res.once('close', () => this.#inFlight--);
    const body = await readBody(req);
    const fault = systemId === undefined ? undefined : this.#takeFault(systemId, method);
    const write = (status: number, json?: unknown) => {
      record.status = status;
      if (json === undefined) res.writeHead(status).end();
      else res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(json));
    };
    const answer = async (status: number, json?: unknown) => {
      if (fault?.afterActing) {
        await slowly(fault, res);
        if (fault.drop) return void req.socket.destroy();
      }
      write(status, json);
    };

    if (fault && !fault.afterActing) {
      await slowly(fault, res);
      if (fault.drop) {
        req.socket.destroy();
        return;
      }
    }
    if (fault?.status !== undefined) {
      return answer(fault.status, redfishError(fault.message ?? `injected HTTP ${fault.status}`));
    }

    if (!credentials || credentials.username !== this.username || !sameText(credentials.password, this.password)) {
      res.setHeader('www-authenticate', 'Basic realm="fake-redfish"');
      return answer(401, redfishError('authentication required'));
    }
    if (method === 'GET' && path === '/redfish/v1/Systems') {
      return answer(200, {
        '@odata.id': '/redfish/v1/Systems',
        '@odata.type': '#ComputerSystemCollection.ComputerSystemCollection',
        Members: [...this.#systems.keys()].map((id) => ({
          '@odata.id': `/redfish/v1/Systems/${encodeURIComponent(id)}`,
        })),
        'Members@odata.count': this.#systems.size,
      });
    }
    const system = systemId === undefined ? undefined : this.#systems.get(systemId);
    if (!system) return answer(404, redfishError(`no resource ${path}`));
    const rest = match?.[3] ?? '';
    const kind = match?.[1];
    const base = `/redfish/v1/${kind}/${encodeURIComponent(system.id)}`;
    const where = system.options.virtualMedia ?? 'manager';
    if (rest.startsWith('/VirtualMedia') && where === (kind === 'Managers' ? 'manager' : 'system')) {
      const reply = await this.#virtualMedia(
        system,
        method,
        `${base}/VirtualMedia`,
        rest.slice('/VirtualMedia'.length),
        body,
      );
      return answer(reply.status, reply.json);
    }
    if (kind === 'Managers') {
      if (method === 'GET' && rest === '') {
        return answer(200, {
          '@odata.id': base,
          '@odata.type': '#Manager.v1_10_0.Manager',
          Id: system.id,
          ManagerType: 'BMC',
          ...(where === 'manager' ? { VirtualMedia: { '@odata.id': `${base}/VirtualMedia` } } : {}),
        });
      }
      return answer(404, redfishError(`no resource ${path}`));
    }
    const etag = `W/"${system.version}"`;
    if (method === 'GET' && rest === '') {
      res.setHeader('etag', etag);
      return answer(200, await this.#resource(system, base));
    }
    if (method === 'GET' && rest === '/ResetActionInfo' && system.options.actionInfo) {
      return answer(200, {
        '@odata.id': `${base}/ResetActionInfo`,
        Parameters: [{ Name: 'ResetType', Required: true, AllowableValues: allowable(system) ?? [] }],
      });
    }
    if (method === 'POST' && rest === '/Actions/ComputerSystem.Reset' && system.options.resetAction !== false) {
      const resetType = isRecord(body) ? body.ResetType : undefined;
      const allowed = allowable(system);
      if (typeof resetType !== 'string' || (allowed !== undefined && !allowed.includes(resetType))) {
        return answer(400, redfishError(`ResetType ${JSON.stringify(resetType)} is not allowed`));
      }
      try {
        await drive(system.power, resetType);
      } catch (error) {
        if (!(error instanceof FakePowerRefusal)) throw error;
        log.fake('system %s: %s refused: %s', system.id, resetType, error.message);
        return answer(409, redfishError(`${resetType} refused: ${error.message}`));
      }
      this.#resets.push({ system: system.id, resetType, at: new Date() });
      system.told.push(`Reset ${resetType}`);
      log.fake('system %s: %s', system.id, resetType);
      return answer(204);
    }
    if (method === 'PATCH' && rest === '') {
      const ifMatch = req.headers['if-match'];
      if (system.options.requireIfMatch && ifMatch === undefined) {
        return answer(428, redfishError('If-Match is required to PATCH this resource'));
      }
      if (system.options.requireIfMatch && ifMatch !== etag) {
        return answer(412, redfishError(`If-Match ${String(ifMatch)} is not the current ETag ${etag}`));
      }
      const boot = isRecord(body) && isRecord(body.Boot) ? body.Boot : undefined;
      const target = boot?.BootSourceOverrideTarget ?? system.boot.target;
      const enabled = boot?.BootSourceOverrideEnabled ?? (target === 'None' ? 'Disabled' : 'Once');
      const mode = boot?.BootSourceOverrideMode ?? system.boot.mode;
      const sources = system.options.bootSources ?? FAKE_BOOT_SOURCES;
      if (!boot || !(sources as readonly unknown[]).includes(target)) {
        return answer(400, redfishError(`want Boot.BootSourceOverrideTarget, one of ${sources.join(', ')}`));
      }
      if (!(BOOT_ENABLED as readonly unknown[]).includes(enabled)) {
        return answer(400, redfishError(`want Boot.BootSourceOverrideEnabled, one of ${BOOT_ENABLED.join(', ')}`));
      }
      if (mode !== undefined && !(BOOT_MODES as readonly unknown[]).includes(mode)) {
        return answer(400, redfishError(`want Boot.BootSourceOverrideMode, one of ${BOOT_MODES.join(', ')}`));
      }
      const said = `BootOverride ${String(target)} ${String(enabled)}${mode === undefined ? '' : ` ${String(mode)}`}`;
      if (system.ignoreOverrides > 0) {
        system.ignoreOverrides--;
        system.told.push(`${said} ignored`);
        log.fake('system %s: boot source override %s ignored', system.id, target);
        return answer(204);
      }
      system.told.push(said);
      system.version++;
      system.boot = {
        target: target as FakeBootSource,
        enabled: enabled as FakeBootOverride['enabled'],
        mode: mode as FakeBootOverride['mode'],
      };
      await system.power.setBootSource?.(system.boot.enabled === 'Disabled' ? 'None' : system.boot.target);
      log.fake('system %s: boot source override %s (%s)', system.id, system.boot.target, system.boot.enabled);
      return answer(204);
    }
    return answer(405, redfishError(`${method} ${path} is not supported`));
  }

  async #resource(system: SystemState, base: string): Promise<unknown> {
    const action: Record<string, unknown> = { target: `${base}/Actions/ComputerSystem.Reset` };
    const values = allowable(system);
    if (system.options.actionInfo) action['@Redfish.ActionInfo'] = `${base}/ResetActionInfo`;
    else if (values !== undefined) action['ResetType@Redfish.AllowableValues'] = values;
    return {
      '@odata.id': base,
      '@odata.type': '#ComputerSystem.v1_20_0.ComputerSystem',
      Id: system.id,
      Name: `fake system ${system.id}`,
      ...(system.options.omitPowerState ? {} : { PowerState: await system.power.state() }),
      Boot: {
        BootSourceOverrideTarget: system.boot.target,
        BootSourceOverrideEnabled: system.boot.enabled,
        ...(system.boot.mode === undefined ? {} : { BootSourceOverrideMode: system.boot.mode }),
        'BootSourceOverrideTarget@Redfish.AllowableValues': [...(system.options.bootSources ?? FAKE_BOOT_SOURCES)],
      },
      ...(system.options.virtualMedia === 'system' ? { VirtualMedia: { '@odata.id': `${base}/VirtualMedia` } } : {}),
      Links: { ManagedBy: [{ '@odata.id': `/redfish/v1/Managers/${encodeURIComponent(system.id)}` }] },
      Actions: system.options.resetAction === false ? {} : { '#ComputerSystem.Reset': action },
    };
  }

  /** A request under a `VirtualMedia` collection at `collection`; `rest` is the path below it. */
  async #virtualMedia(
    system: SystemState,
    method: string,
    collection: string,
    rest: string,
    body: unknown,
  ): Promise<{ status: number; json?: unknown }> {
    if (method === 'GET' && rest === '') {
      return {
        status: 200,
        json: {
          '@odata.id': collection,
          '@odata.type': '#VirtualMediaCollection.VirtualMediaCollection',
          Members: Object.keys(MEDIA).map((id) => ({ '@odata.id': `${collection}/${id}` })),
          'Members@odata.count': Object.keys(MEDIA).length,
        },
      };
    }
    const [, id, action] =
      /^\/([^/]+)(?:\/Actions\/(VirtualMedia\.InsertMedia|VirtualMedia\.EjectMedia))?$/.exec(rest) ?? [];
    const types = id === undefined ? undefined : MEDIA[id];
    if (id === undefined || types === undefined) return { status: 404, json: redfishError(`no virtual media ${rest}`) };
    const url = `${collection}/${id}`;
    const media = id === 'CD' ? system.cd : EJECTED;
    if (method === 'GET' && action === undefined) {
      return {
        status: 200,
        json: {
          '@odata.id': url,
          '@odata.type': '#VirtualMedia.v1_6_0.VirtualMedia',
          Id: id,
          MediaTypes: types,
          Inserted: media.inserted,
          Image: media.image ?? null,
          WriteProtected: media.writeProtected ?? true,
          TransferProtocolType: media.transferProtocolType ?? null,
          Actions: {
            '#VirtualMedia.InsertMedia': { target: `${url}/Actions/VirtualMedia.InsertMedia` },
            '#VirtualMedia.EjectMedia': { target: `${url}/Actions/VirtualMedia.EjectMedia` },
          },
        },
      };
    }
    if (method !== 'POST' || action === undefined || id !== 'CD') {
      return {
        status: 405,
        json: redfishError(`${method} ${url}${action === undefined ? '' : ` ${action}`} is not supported`),
      };
    }
    if (action === 'VirtualMedia.EjectMedia') {
      if (!media.inserted) return { status: 409, json: redfishError('no media is inserted') };
      system.cd = EJECTED;
      system.told.push('EjectMedia');
      await system.power.setMedia?.(undefined);
      log.fake('system %s: virtual media ejected', system.id);
      return { status: 204 };
    }
    const image = isRecord(body) ? body.Image : undefined;
    if (typeof image !== 'string' || !/^https?:\/\//.test(image)) {
      return { status: 400, json: redfishError('want Image, an http(s):// URL') };
    }
    if (media.inserted) {
      return { status: 409, json: redfishError('Virtual Media is already connected: eject it first') };
    }
    if (system.options.refuseInsertMedia) {
      return { status: 400, json: redfishError(`Unable to connect to the image at ${image}`) };
    }
    const text = (value: unknown) => (typeof value === 'string' ? value : undefined);
    system.cd = {
      inserted: isRecord(body) && body.Inserted !== false,
      image,
      writeProtected: isRecord(body) && typeof body.WriteProtected === 'boolean' ? body.WriteProtected : undefined,
      transferProtocolType: isRecord(body) ? text(body.TransferProtocolType) : undefined,
    };
    system.told.push(`InsertMedia ${image} (${system.cd.transferProtocolType ?? 'no TransferProtocolType'})`);
    await system.power.setMedia?.(image);
    log.fake('system %s: virtual media inserted', system.id);
    return { status: 204 };
  }

  #takeFault(systemId: string, method: string): PendingFault | undefined {
    for (const key of [systemId, '*']) {
      const list = this.#faults.get(key);
      const fault = list?.find((f) => f.method === undefined || f.method === method);
      if (!list || !fault) continue;
      fault.remaining--;
      if (fault.remaining <= 0) list.splice(list.indexOf(fault), 1);
      return fault;
    }
    return undefined;
  }
}

/** A fault's wait: its delay and what it waits for, cut short when the client hangs up. */
async function slowly(fault: FakeRedfishFault, res: ServerResponse): Promise<void> {
  if (!fault.delay && fault.until === undefined) return;
  let timer: NodeJS.Timeout | undefined;
  const hungUp = new Promise<void>((resolve) => res.once('close', () => resolve()));
  const waits: Promise<unknown>[] = [];
  if (fault.delay) waits.push(new Promise((resolve) => (timer = setTimeout(resolve, fault.delay))));
  if (fault.until !== undefined) waits.push(fault.until);
  await Promise.race([Promise.all(waits), ...(fault.afterActing ? [hungUp] : [])]);
  clearTimeout(timer);
}

/** What a reset type does to a system's power. */
async function drive(power: FakePowerBackend, resetType: string): Promise<void> {
  switch (resetType) {
    case 'On':
    case 'ForceOn':
      return power.on();
    case 'ForceOff':
      return power.off(false);
    case 'GracefulShutdown':
      return power.off(true);
    case 'ForceRestart':
    case 'GracefulRestart':
    case 'PowerCycle':
      return power.restart();
    case 'PushPowerButton': {
      const state = await power.state();
      return state === 'On' || state === 'PoweringOn' ? power.off(true) : power.on();
    }
    default:
      return;
  }
}

function allowable(system: SystemState): readonly string[] | undefined {
  const values = system.options.allowableResetTypes;
  return values === null ? undefined : (values ?? DEFAULT_ALLOWABLE);
}

function redfishError(message: string): unknown {
  return { error: { code: 'Base.1.0.GeneralError', message, '@Message.ExtendedInfo': [{ Message: message }] } };
}

function basicAuth(header: string | undefined): { username: string; password: string } | undefined {
  const match = /^Basic\s+(\S+)$/i.exec(header ?? '');
  if (!match?.[1]) return undefined;
  const decoded = Buffer.from(match[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  if (colon < 0) return undefined;
  return { username: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
}

function sameText(a: string, b: string): boolean {
  const left = Buffer.from(a);
  const right = Buffer.from(b);
  return left.length === right.length && timingSafeEqual(left, right);
}

async function readBody(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
