import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import {
  MACHINE_STAGES,
  type MachineFilter,
  type MachineStage,
  OSInstallationState,
  PowerState,
  type RecoveryThresholds,
} from '@bmaas/bmdb-model';
import { describeError, isUuid } from '@bmaas/common';
import { checkTlsRule, checkTokenRule, expiredLoginCookie, parseCookies, TokenCheck } from './access.js';
import {
  type BMDBReader,
  readExactMatch,
  readMachine,
  readMachineList,
  readOverview,
  readRetiredMachine,
} from './data.js';
import { type Html, href } from './html.js';
import { type Frame, layout, notice } from './pages/layout.js';
import { loginPage } from './pages/login.js';
import { machinePage } from './pages/machine.js';
import { filterQuery, machinesPage } from './pages/machines.js';
import { overviewPage } from './pages/overview.js';
import { STYLESHEET } from './style.js';

/** How the fleet page reads the BMDB and whom it lets in. */
export interface FleetPageOptions {
  /** The BMDB to read (`BMDB.db`); only read-only transactions are run on it. */
  readonly db: BMDBReader;
  /** Requests must carry this token (bearer or login cookie); without it, anyone reaching the port may read. */
  readonly token?: string | undefined;
  /** When an agent counts as lost, as the recoverer is configured. Library defaults otherwise. */
  readonly thresholds?: RecoveryThresholds | undefined;
  /** Seconds between a page's automatic refreshes, unless the viewer turned them off. Default 10. */
  readonly refreshSeconds?: number | undefined;
  /** Told about requests that failed on the database side (answered 503); never about bad input (400). */
  readonly onError?: ((error: unknown, path: string) => void) | undefined;
  /**
   * Browsers reach the page over HTTPS (it is served with TLS, or a TLS proxy
   * in front terminates it): its cookies are `Secure` and every answer asks
   * for HTTPS only from then on (`Strict-Transport-Security`, a year).
   * `serveFleetPage` sets it when it serves TLS or is told of a proxy.
   */
  readonly secure?: boolean | undefined;
}

/** The page's certificate (with its chain) and private key, PEM. */
export interface FleetPageTls {
  readonly cert: string;
  readonly key: string;
}

/** How long browsers keep to HTTPS for the page's host once told: a year. */
const HSTS = 'max-age=31536000';

/** A request the page cannot answer as asked: 400 with a message naming the parameter. */
class BadRequest extends Error {}

const REFRESH_COOKIE = 'shepherd_web_refresh';
/** The origin request targets are read against: only their path and query matter. */
const SITE = 'http://fleet.invalid';
const MACHINE_PATH = /^\/(api\/)?machines\/([^/]+)$/;
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
  'cache-control': 'no-store',
};

/**
 * The fleet page as a Node request listener: HTML at `/`, `/machines` and
 * `/machines/<id>`, the same data as JSON under `/api/`. Read-only; every
 * string shown is escaped.
 */
export function fleetPageHandler(options: FleetPageOptions): RequestListener {
  const tokens = options.token === undefined ? undefined : new TokenCheck(options.token);
  const thresholds = options.thresholds ?? {};
  const refreshSeconds = options.refreshSeconds ?? 10;
  const secure = options.secure ?? false;
  const cookieFlags = secure ? '; Secure' : '';

  return (request, response) => {
    if (secure) response.setHeader('strict-transport-security', HSTS);
    handle(request, response).catch((error: unknown) => {
      if (response.headersSent) {
        response.destroy();
        return;
      }
      if (error instanceof BadRequest) {
        if (isApi(request)) sendJson(response, 400, { error: error.message });
        else
          sendPage(
            response,
            400,
            { ...frameFor(request, 'machines'), title: 'Bad request' },
            notice('Bad request', error.message, 'error'),
          );
        return;
      }
      options.onError?.(error, request.url ?? '');
      const message = `the BMDB could not be read: ${describeError(error)}${
        isOldSchema(error) ? ' (is its schema up to date? run `shepherd migrate`)' : ''
      }`;
      if (isApi(request)) sendJson(response, 503, { error: message });
      else
        sendPage(
          response,
          503,
          { ...frameFor(request, 'overview'), title: 'Unavailable' },
          notice('Unavailable', message, 'error'),
        );
    });
  };

  function frameFor(request: IncomingMessage, section: Frame['section'], now?: Date): Frame {
    const off = parseCookies(request.headers.cookie)[REFRESH_COOKIE] === 'off';
    return {
      title: '',
      path: request.url ?? '/',
      section,
      refreshSeconds: off ? undefined : refreshSeconds,
      now,
      loggedIn: tokens !== undefined && section !== 'login',
    };
  }

  async function handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = requestUrl(request.url ?? '/');
    const path = url.pathname;
    const method = request.method ?? 'GET';

    if (path === '/style.css' && isRead(method)) {
      response.writeHead(200, { 'content-type': 'text/css; charset=utf-8', 'cache-control': 'max-age=300' });
      response.end(STYLESHEET);
      return;
    }
    if (path === '/login' && tokens) {
      if (method === 'POST') return login(request, response, tokens, secure);
      if (isRead(method)) {
        const next = localPath(url.searchParams.get('next'));
        sendPage(response, 200, { ...frameFor(request, 'login'), title: 'Log in' }, loginPage(next, false));
        return;
      }
    }
    if (path === '/logout' && tokens && isRead(method)) {
      response.writeHead(303, { location: '/login', 'set-cookie': expiredLoginCookie(secure) }).end();
      return;
    }
    if (tokens && !tokens.admits(request.headers)) {
      if (isApi(request)) {
        response.setHeader('www-authenticate', 'Bearer realm="shepherd fleet"');
        sendJson(response, 401, { error: 'this page needs the web token: send Authorization: Bearer <token>' });
      } else {
        response.writeHead(303, { location: href('/login', { next: localPath(request.url) }) }).end();
      }
      return;
    }
    if (!isRead(method)) {
      response
        .writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' })
        .end('the fleet page is read-only\n');
      return;
    }

    await route(request, response, url);
  }

  async function route(request: IncomingMessage, response: ServerResponse, url: URL): Promise<void> {
    const path = url.pathname;
    if (path === '/refresh') {
      const on = url.searchParams.get('set') !== 'off';
      response.writeHead(303, {
        location: localPath(url.searchParams.get('back')),
        'set-cookie': `${REFRESH_COOKIE}=${on ? 'on' : 'off'}; SameSite=Strict; Path=/; Max-Age=31536000${cookieFlags}`,
      });
      response.end();
      return;
    }
    if (path === '/' || path === '/api/overview') {
      const overview = await readOverview(options.db, thresholds);
      if (path === '/')
        sendPage(
          response,
          200,
          { ...frameFor(request, 'overview', overview.now), title: 'Overview' },
          overviewPage(overview),
        );
      else sendJson(response, 200, overview);
      return;
    }
    if (path === '/machines' || path === '/api/machines') {
      const api = path === '/api/machines';
      const filter = parseFilter(url.searchParams, api);
      if (!api && filter.search && filter.after === undefined) {
        const exact = await readExactMatch(options.db, filter.search);
        if (exact !== undefined) {
          response.writeHead(303, { location: `/machines/${exact}` }).end();
          return;
        }
      }
      const list = await readMachineList(options.db, filter, thresholds);
      if (!api) {
        sendPage(response, 200, { ...frameFor(request, 'machines', list.now), title: 'Machines' }, machinesPage(list));
        return;
      }
      sendJson(response, 200, {
        now: list.now,
        filter: list.filter,
        machines: list.machines,
        next: list.next ?? null,
        nextUrl: list.next === undefined ? null : href('/api/machines', filterQuery(filter, list.next)),
      });
      return;
    }
    const match = MACHINE_PATH.exec(path);
    if (match) {
      const api = match[1] !== undefined;
      const id = machineIdOf(match[2] ?? '');
      const machine = await readMachine(options.db, id, thresholds);
      if (machine === undefined) {
        const retired = await readRetiredMachine(options.db, id);
        const message =
          retired === undefined
            ? `no machine ${JSON.stringify(id)} in the BMDB`
            : `machine ${id} is retired: ${retired.provider} ${retired.providerId}, decommissioned ${retired.retiredAt.toISOString()} by ${retired.actor ?? 'an unnamed actor'}${retired.wiped ? ' after its disks were wiped' : ''}${retired.reason === null ? '' : `: ${retired.reason}`}; shepherd recommission brings it back as a new machine`;
        if (api) sendJson(response, 404, { error: message });
        else
          sendPage(
            response,
            404,
            { ...frameFor(request, 'machine'), title: 'Not found' },
            notice('Not found', message),
          );
        return;
      }
      if (api) sendJson(response, 200, machine);
      else
        sendPage(
          response,
          200,
          { ...frameFor(request, 'machine', machine.now), title: machine.provided?.providerId ?? machine.machineId },
          machinePage(machine),
        );
      return;
    }
    const message = `nothing at ${JSON.stringify(path)}: the pages are /, /machines and /machines/<machine-id>, JSON under /api/`;
    if (isApi(request)) sendJson(response, 404, { error: message });
    else
      sendPage(response, 404, { ...frameFor(request, 'overview'), title: 'Not found' }, notice('Not found', message));
  }
}

/** `POST /login`: the token from the form, once; a login cookie from then on. */
async function login(
  request: IncomingMessage,
  response: ServerResponse,
  tokens: TokenCheck,
  secure: boolean,
): Promise<void> {
  const form = new URLSearchParams(await readBody(request, 8192));
  const next = localPath(form.get('next'));
  if (tokens.matches(form.get('token') ?? '')) {
    response.writeHead(303, { location: next, 'set-cookie': tokens.loginCookie(secure) }).end();
    return;
  }
  sendPage(
    response,
    401,
    { title: 'Log in', path: '/login', section: 'login', refreshSeconds: undefined },
    loginPage(next, true),
  );
}

/** The request body as text; a longer one is read to its end and refused. */
function readBody(request: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let body = '';
    let tooLarge = false;
    request.setEncoding('utf8');
    request.on('data', (chunk: string) => {
      if (tooLarge) return;
      body += chunk;
      tooLarge = body.length > limit;
    });
    request.on('end', () =>
      tooLarge ? reject(new BadRequest(`a login form is at most ${limit} bytes`)) : resolve(body),
    );
    request.on('error', reject);
  });
}

/** The request's target as a URL of this site; a target that is no URL is a {@link BadRequest} naming it. */
function requestUrl(target: string): URL {
  try {
    // An origin-form target is a path even when it starts with `//`, which on its own would read as a host.
    return target.startsWith('/') ? new URL(`${SITE}${target}`) : new URL(target, SITE);
  } catch {
    throw new BadRequest(`the request target ${JSON.stringify(target)} is not a URL`);
  }
}

/** The machine ID of a `/machines/<id>` path, decoded; malformed percent-encoding is a {@link BadRequest} naming it. */
function machineIdOf(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new BadRequest(`machine ID ${JSON.stringify(segment)} is not valid percent-encoding`);
  }
}

/** The longest value a filter takes: longer ones name no machine, provider or process. */
const MAX_FILTER_LENGTH = 200;

/** The filter of a `/machines` or `/api/machines` query; a bad value is a {@link BadRequest} naming it. */
function parseFilter(params: URLSearchParams, api: boolean): MachineFilter {
  const value = (name: string) => {
    const v = params.get(name)?.trim();
    if (v === undefined || v === '') return undefined;
    if (v.length > MAX_FILTER_LENGTH) throw new BadRequest(`${name} is at most ${MAX_FILTER_LENGTH} characters`);
    // PostgreSQL takes no NUL in text, and no ID or name holds a control character.
    if (/\p{Cc}/u.test(v)) throw new BadRequest(`${name} ${JSON.stringify(v)} holds a control character`);
    return v;
  };
  const stage = value('stage');
  if (stage !== undefined && !MACHINE_STAGES.includes(stage as MachineStage)) {
    throw new BadRequest(`stage ${JSON.stringify(stage)} is not a stage: want one of ${MACHINE_STAGES.join(', ')}`);
  }
  const after = value('after');
  if (after !== undefined && !isUuid(after)) {
    throw new BadRequest(`after ${JSON.stringify(after)} is not a machine ID (a UUID)`);
  }
  const limitText = value('limit');
  let limit = 50;
  if (limitText !== undefined) {
    if (!api) throw new BadRequest('limit is for /api/machines; pages show 50 machines');
    limit = Number(limitText);
    if (!/^\d+$/.test(limitText) || limit < 1 || limit > 500)
      throw new BadRequest(`limit ${JSON.stringify(limitText)}: want a whole number from 1 to 500`);
  }
  const backoff = value('backoff');
  const search = value('q');
  const filter: { -readonly [K in keyof MachineFilter]: MachineFilter[K] } = { limit };
  if (stage !== undefined) filter.stage = stage as MachineStage;
  const provider = value('provider');
  if (provider !== undefined) filter.provider = provider;
  const work = value('work');
  if (work !== undefined) filter.liveWork = work;
  if (backoff !== undefined) filter.inBackoff = backoff === 'any' ? true : backoff;
  if (search !== undefined) filter.search = search;
  if (after !== undefined) filter.after = after.toLowerCase();
  const held = value('held');
  if (held !== undefined) {
    if (held !== 'yes' && held !== 'no') throw new BadRequest(`held ${JSON.stringify(held)}: want yes or no`);
    filter.held = held === 'yes';
  }
  const power = value('power');
  if (power !== undefined) {
    if (!POWER_FILTERS.includes(power)) {
      throw new BadRequest(
        `power ${JSON.stringify(power)} is not a power state: want one of ${POWER_FILTERS.join(', ')}`,
      );
    }
    filter.powerState = power as MachineFilter['powerState'];
  }
  const installation = value('installation');
  if (installation !== undefined) {
    if (!INSTALLATION_FILTERS.includes(installation)) {
      throw new BadRequest(
        `installation ${JSON.stringify(installation)} is not an installation state: want one of ${INSTALLATION_FILTERS.join(', ')}`,
      );
    }
    filter.installation = installation as OSInstallationState;
  }
  return filter;
}

/** Generations are bigints: numbers in JSON (they stay far below 2^53). */
function jsonValue(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? Number(value) : value;
}

/** The `installation` filter's values. */
const INSTALLATION_FILTERS: readonly string[] = Object.values(OSInstallationState);

/** The `power` filter's values: the power states, and `Unread` for machines never read. */
const POWER_FILTERS: readonly string[] = [...Object.values(PowerState), 'Unread'];

/** A missing table or column: the BMDB predates a migration the page reads (0004). */
function isOldSchema(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code;
  return code === '42P01' || code === '42703';
}

function isRead(method: string): boolean {
  return method === 'GET' || method === 'HEAD';
}

function isApi(request: IncomingMessage): boolean {
  return (request.url ?? '').startsWith('/api/');
}

/** A path on this site to send a browser back to; anything else (another host, `//x`) becomes `/`. */
function localPath(value: string | null | undefined): string {
  if (!value?.startsWith('/') || value.startsWith('//')) return '/';
  // A backslash or control character could turn the path into another host for some browsers.
  for (const char of value) if (char === '\\' || char.charCodeAt(0) < 0x20) return '/';
  return value;
}

function sendPage(response: ServerResponse, status: number, frame: Frame, content: Html): void {
  response.writeHead(status, { ...SECURITY_HEADERS, 'content-type': 'text/html; charset=utf-8' });
  response.end(layout(frame, content).value);
}

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  response.writeHead(status, { ...SECURITY_HEADERS, 'content-type': 'application/json; charset=utf-8' });
  response.end(`${JSON.stringify(body, jsonValue, 2)}\n`);
}

/** A fleet page listening on a port. */
export interface FleetPageServer {
  /** `https://host:port/` (or `http://` without TLS), where it serves. */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  /** Stops listening and ends open connections. */
  close(): Promise<void>;
}

/** The page could not listen on the address asked for. */
export class WebListenError extends Error {
  override name = 'WebListenError';
  constructor(
    readonly host: string,
    readonly port: number,
    reason: string,
    options?: ErrorOptions,
  ) {
    super(`cannot serve the fleet page on ${host}:${port} (${reason})`, options);
  }
}

/** Where and how {@link serveFleetPage} serves. */
export interface ServeOptions {
  readonly host: string;
  /** 0: any free port. */
  readonly port: number;
  /** Serve HTTPS with this certificate. */
  readonly tls?: FleetPageTls | undefined;
  /**
   * Serve plain HTTP beyond loopback: a TLS proxy in front terminates TLS and
   * browsers reach it over HTTPS (so the page is still `secure`).
   */
  readonly insecureHttp?: boolean | undefined;
}

/**
 * Serves the fleet page on `host:port`, over HTTPS when given a certificate.
 * Refuses to listen beyond loopback without a token ({@link WebTokenError})
 * or without TLS, its own or a proxy's ({@link WebTlsError}). The page is
 * `secure` (Secure cookies, HSTS) whenever TLS is involved.
 */
export async function serveFleetPage(options: FleetPageOptions & ServeOptions): Promise<FleetPageServer> {
  checkTokenRule(options.host, options.token);
  const insecureHttp = options.insecureHttp ?? false;
  checkTlsRule(options.host, { tls: options.tls !== undefined, insecureHttp });
  const handler = fleetPageHandler({
    ...options,
    secure: options.secure ?? (options.tls !== undefined || insecureHttp),
  });
  const server: Server = options.tls
    ? createTlsServer({ cert: options.tls.cert, key: options.tls.key }, handler)
    : createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) =>
      reject(new WebListenError(options.host, options.port, error.code ?? error.message, { cause: error })),
    );
    server.listen(options.port, options.host, resolve);
  });
  const port = (server.address() as AddressInfo).port;
  const shownHost = options.host.includes(':') ? `[${options.host}]` : options.host;
  return {
    url: `${options.tls ? 'https' : 'http'}://${shownHost}:${port}/`,
    host: options.host,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * Attaches the fleet page to a process that has the BMDB open (`shepherd run`,
 * a server): serves it on `listen` until the returned server is closed.
 */
export function attachFleetPage(
  bmdb: BMDB,
  options: Omit<FleetPageOptions, 'db'> &
    Omit<ServeOptions, 'host' | 'port'> & { listen: { host: string; port: number } },
): Promise<FleetPageServer> {
  return serveFleetPage({ ...options, db: bmdb.db, host: options.listen.host, port: options.listen.port });
}
