import { randomBytes } from 'node:crypto';
import { access, chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AGENT_KERNEL_ARGUMENTS, agentEnrollmentArchive, configureAgentIso } from '@bmaas/agent';
import { type TakeoverInit, TakeoverInitSchema } from '@bmaas/api/cloud/agent/api/takeover_pb';
import type { Database } from '@bmaas/bmdb-controlloop';
import { liveNetworkBoot, liveNetworkBootsByMac, serveNetworkBootConfig } from '@bmaas/bmdb-model';
import { describeError, type Secret } from '@bmaas/common';
import { fromBinary } from '@bufbuild/protobuf';
import type { Kysely } from 'kysely';
import { type FileSent, sendFile } from './boot-files/file-response.js';
import { agentBootScript, noAgentBootScript, normalizeMac } from './boot-files/ipxe.js';
import { type AgentBootFilesLimits, agentBootFilesLimits, holdConnections } from './boot-files/limits.js';
import { detail, log } from './internal.js';
import { ShepherdError } from './provider.js';

/** The agent image's files, as `shepherd agent-image build --out DIR` names them. */
const IMAGE_FILES = ['vmlinuz', 'initramfs', 'agent.iso'] as const;
const PREFIX = '/agent-boot';
/** A boot's capability: the unguessable part of its URLs, 32 random bytes. */
const CAPABILITY_BYTES = 32;

/** Where and how {@link AgentBootFiles} serves. */
export interface AgentBootFilesOptions {
  /** The directory `shepherd agent-image build --out DIR` wrote: `vmlinuz`, `initramfs`, `agent.iso`. */
  readonly imageDir: string;
  /** The BMDB the network boots are answered from, whichever process armed them (`bmdb.db`). */
  readonly db: Kysely<Database>;
  /** Where this server's directory of boots is made (and removed at close). Default the system's temporary directory. */
  readonly workDir?: string | undefined;
  /** The address to listen on; port 0: any free port. */
  readonly listen: { readonly host: string; readonly port: number };
  /** Serve HTTPS with this certificate and key (PEM); absent: plain HTTP. */
  readonly tls?: { readonly cert: string | Buffer; readonly key: string | Buffer } | undefined;
  /**
   * The URL machines reach this server at, without a path (`https://shepherd.example:8443`):
   * BMCs and iPXE fetch by a name they resolve, which the listening address may not be.
   * Default the listening address.
   */
  readonly publicUrl?: string | undefined;
  /** What clients may hold of the server (connections, time without progress); the rest default. */
  readonly limits?: Partial<AgentBootFilesLimits> | undefined;
}

/** One virtual media boot of one machine's agent, as {@link AgentBootFiles.prepare} takes it. */
export interface AgentBootRequest {
  readonly machineId: string;
  /** The takeover's settings the agent enrolls with: machine ID, BMaaS endpoint, its CA. */
  readonly init: TakeoverInit;
  /** This boot's enrollment token; it is written into the boot's ISO and nowhere else. */
  readonly token: Secret;
  /** The agent's flags (`--interval=10s`), written into the boot's config beside the token. */
  readonly flags?: readonly string[];
}

/** Where a machine's BMC fetches its virtual media boot; the path is unguessable, and the ISO holds the token. */
export interface PreparedAgentBoot {
  readonly machineId: string;
  /** The unguessable part of the boot's URL, by which it is forgotten. Never log it. */
  readonly capability: string;
  /** This boot's ISO (the image's, with this boot's config as `/boot/config.cpio`). */
  readonly isoUrl: string;
}

/** The boot files could not be served or a boot not prepared; names the machine when one is involved. */
export class AgentBootFilesError extends ShepherdError {
  override name = 'AgentBootFilesError';
  constructor(
    /** The machine whose boot failed; undefined for the server's own failures. */
    readonly machine: string | undefined,
    message: string,
    options?: ErrorOptions,
  ) {
    super(machine === undefined ? message : `machine ${machine}: ${message}`, options);
  }
}

/** A prepared virtual media boot: its machine and directory, by capability. */
interface MediaBoot {
  readonly machineId: string;
  readonly dir: string;
}

/**
 * The HTTP(S) server a machine's BMC or iPXE boots the agent from: the agent
 * image (`/agent-boot/vmlinuz`, `/agent-boot/initramfs`, `/agent-boot/agent.iso`),
 * each virtual media boot's ISO under an unguessable path
 * (`/agent-boot/b/<capability>/agent.iso`), and each network boot's iPXE
 * script (`GET /agent-boot/ipxe?mac=...` by the machine's MAC, and
 * `/agent-boot/b/<capability>/script.ipxe`) and config
 * (`/agent-boot/b/<capability>/config.cpio`). Files are answered in ranges
 * (BMCs fetch ISOs in pieces), with HEAD and ETag, streamed from disk.
 * HTTP/1.1 alone: that is what BMCs and iPXE speak.
 *
 * A virtual media boot is this process's ({@link AgentBootFiles.prepare}):
 * its token's plain text stays in this process and this server's work
 * directory (mode 0700, its files 0600) until the boot is forgotten, and it
 * is never answered by MAC. A network boot is the BMDB's (`armNetworkBoot`,
 * by the agent booter of whichever process claimed the machine): any
 * process's boot files answer its script while it is live, and serve its
 * config once, with a token minted as it is served (`serveNetworkBootConfig`);
 * a second fetch is refused (410) and fails the boot. Capabilities and
 * tokens are never logged; requests are, by machine, file and range.
 */
export class AgentBootFiles {
  readonly #server: Server;
  readonly #imageDir: string;
  readonly #workDir: string;
  readonly #publicUrl: string;
  readonly #db: Kysely<Database>;
  readonly #byCapability = new Map<string, MediaBoot>();
  /** Prepares under way, which close waits for. */
  readonly #preparing = new Set<Promise<unknown>>();
  #closed = false;

  private constructor(server: Server, options: AgentBootFilesOptions, workDir: string, publicUrl: string) {
    this.#server = server;
    this.#imageDir = options.imageDir;
    this.#db = options.db;
    this.#workDir = workDir;
    this.#publicUrl = publicUrl;
  }

  /**
   * Checks the image directory, makes the work directory and listens.
   *
   * @throws {@link AgentBootFilesError} naming the missing image file, a public URL that is not one, or the address it could not listen on
   * @throws RangeError naming a limit that is not a whole number above zero
   */
  static async start(options: AgentBootFilesOptions): Promise<AgentBootFiles> {
    const limits = agentBootFilesLimits(options.limits);
    for (const file of IMAGE_FILES) {
      await access(path.join(options.imageDir, file)).catch((error: unknown) => {
        throw new AgentBootFilesError(
          undefined,
          `agent image ${path.join(options.imageDir, file)} is missing (build it with shepherd agent-image build --out ${options.imageDir}): ${describeError(error)}`,
          { cause: error },
        );
      });
    }
    const publicUrl = options.publicUrl === undefined ? undefined : checkedPublicUrl(options.publicUrl);
    let files: AgentBootFiles | undefined;
    const handler: RequestListener = (request, response) => {
      if (files) void files.#answer(request, response);
      else response.writeHead(503).end();
    };
    const server: Server = options.tls
      ? createTlsServer({ cert: options.tls.cert, key: options.tls.key }, handler)
      : createServer(handler);
    holdConnections(server, limits);
    const { host, port } = options.listen;
    await new Promise<void>((resolve, reject) => {
      server.once('error', (error: NodeJS.ErrnoException) =>
        reject(
          new AgentBootFilesError(
            undefined,
            `cannot serve agent boot files on ${host}:${port} (${error.code ?? error.message})`,
            {
              cause: error,
            },
          ),
        ),
      );
      server.listen(port, host, resolve);
    });
    const baseDir = options.workDir ?? tmpdir();
    let workDir: string;
    try {
      await mkdir(baseDir, { recursive: true });
      workDir = await mkdtemp(path.join(baseDir, 'agent-boot-'));
    } catch (error) {
      server.close();
      throw new AgentBootFilesError(
        undefined,
        `cannot make the agent boot work directory in ${baseDir}: ${describeError(error)}`,
        {
          cause: error,
        },
      );
    }
    const bound = (server.address() as AddressInfo).port;
    const shownHost = host.includes(':') ? `[${host}]` : host;
    files = new AgentBootFiles(
      server,
      options,
      workDir,
      publicUrl ?? `${options.tls ? 'https' : 'http'}://${shownHost}:${bound}`,
    );
    log.bootFiles('serving agent boot files from %s on %s:%d as %s', options.imageDir, host, bound, files.#publicUrl);
    return files;
  }

  /** The URL machines reach this server at (no trailing slash). */
  get url(): string {
    return this.#publicUrl;
  }

  /** The port listened on. */
  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  /**
   * Makes one virtual media boot of a machine's agent: its config initramfs
   * holding the enrollment token (`agentEnrollmentArchive`) and its ISO (the
   * image's with that config as `/boot/config.cpio`), under a new
   * unguessable path, served until {@link AgentBootFiles.forget} forgets
   * this boot. Another boot of the machine, prepared before or since, is
   * left alone. No MAC answers it: a network boot is armed in the BMDB.
   *
   * @throws {@link AgentBootFilesError} naming the machine: the ISO not made, or the server closed
   */
  prepare(boot: AgentBootRequest): Promise<PreparedAgentBoot> {
    const preparing = this.#prepare(boot);
    this.#preparing.add(preparing);
    void preparing.then(
      () => this.#preparing.delete(preparing),
      () => this.#preparing.delete(preparing),
    );
    return preparing;
  }

  /** Removes this boot (after its enrollment, or giving up): its files are gone, its URL answers 404. */
  async forget(boot: PreparedAgentBoot): Promise<void> {
    const prepared = this.#byCapability.get(boot.capability);
    if (prepared === undefined) return;
    this.#byCapability.delete(boot.capability);
    await rm(prepared.dir, { recursive: true, force: true });
    log.bootFiles('forgot an agent boot of machine %s', prepared.machineId);
  }

  /** Stops listening, ends open connections and removes every boot's files. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections();
    });
    await Promise.allSettled(this.#preparing);
    this.#byCapability.clear();
    await rm(this.#workDir, { recursive: true, force: true });
  }

  async #prepare(request: AgentBootRequest): Promise<PreparedAgentBoot> {
    const { machineId } = request;
    if (this.#closed) throw new AgentBootFilesError(machineId, 'agent boot files are closed');
    const capability = newCapability();
    const dir = await mkdtemp(path.join(this.#workDir, 'boot-'));
    try {
      const config = path.join(dir, 'config.cpio');
      await writeFile(
        config,
        agentEnrollmentArchive({ init: request.init, token: request.token, flags: request.flags ?? [] }),
        { mode: 0o600 },
      );
      const iso = path.join(dir, 'agent.iso');
      await configureAgentIso(path.join(this.#imageDir, 'agent.iso'), config, iso);
      await chmod(iso, 0o600);
      // The ISO holds the config; the config alone is served to no one.
      await rm(config);
    } catch (error) {
      await rm(dir, { recursive: true, force: true });
      throw new AgentBootFilesError(
        machineId,
        `cannot make its agent boot files: ${request.token.scrub(describeError(error))}`,
        { cause: error },
      );
    }
    if (this.#closed) {
      await rm(dir, { recursive: true, force: true });
      throw new AgentBootFilesError(machineId, 'agent boot files are closed');
    }
    this.#byCapability.set(capability, { machineId, dir });
    log.bootFiles('prepared a virtual media boot of machine %s', machineId);
    return { machineId, capability, isoUrl: `${this.#publicUrl}${PREFIX}/b/${capability}/agent.iso` };
  }

  /** The iPXE script of the network boot of `capability`, with this server's URLs. */
  #script(capability: string): string {
    return agentBootScript(
      {
        kernel: `${this.#publicUrl}${PREFIX}/vmlinuz`,
        initramfs: `${this.#publicUrl}${PREFIX}/initramfs`,
        config: `${this.#publicUrl}${PREFIX}/b/${capability}/config.cpio`,
      },
      AGENT_KERNEL_ARGUMENTS,
    );
  }

  async #answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const from = request.socket.remoteAddress ?? 'unknown';
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      response.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    const route = routeOf(request.url ?? '');
    if (route === undefined) {
      response.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' }).end('not a path\n');
      return;
    }
    try {
      if (route.path === 'ipxe') {
        await this.#answerIpxe(route.query.get('mac'), request, response, from);
        return;
      }
      const image = IMAGE_FILES.find((file) => file === route.path);
      if (image !== undefined) {
        const sent = await sendFile(request, response, path.join(this.#imageDir, image), {
          contentType: contentType(image),
          cacheControl: 'no-cache',
        });
        detail.bootFiles('%s %s %s', from, image, describeSent(sent));
        return;
      }
      const [, capability = '', name = ''] = /^b\/([A-Za-z0-9_-]{43})\/([a-z.]+)$/.exec(route.path) ?? [];
      if (name === 'agent.iso') {
        const boot = this.#byCapability.get(capability);
        if (boot !== undefined) {
          const sent = await sendFile(request, response, path.join(boot.dir, name), {
            contentType: contentType(name),
            cacheControl: 'no-store',
          });
          // A BMC reads an ISO in many ranges: one line each is a detail.
          detail.bootFiles('machine %s: %s %s to %s', boot.machineId, name, describeSent(sent), from);
          return;
        }
      }
      if (name === 'script.ipxe') {
        const machineId = await liveNetworkBoot(this.#db, capability);
        if (machineId !== undefined) {
          log.bootFiles('machine %s: iPXE script to %s', machineId, from);
          sendText(request, response, this.#script(capability));
          return;
        }
      }
      if (name === 'config.cpio' && request.method === 'GET') {
        if (await this.#serveConfig(capability, response, from)) return;
      }
      // Never the path: a capability mistyped by one character is still nearly one.
      detail.bootFiles(
        '%s asked for %s, which is not served',
        from,
        route.path.startsWith('b/') ? 'a boot file' : 'a path',
      );
      response.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
    } catch (error) {
      log.bootFiles('answering %s failed: %s', from, describeError(error));
      if (!response.headersSent) response.writeHead(500).end();
      else response.destroy();
    }
  }

  /**
   * Serves a network boot's config, once (see `serveNetworkBootConfig`):
   * answers 410 to a fetch after that, which fails the boot. False for a
   * capability no network boot has. A HEAD is never answered: it would spend the one serve.
   */
  async #serveConfig(capability: string, response: ServerResponse, from: string): Promise<boolean> {
    const config = await serveNetworkBootConfig(this.#db, capability, from);
    if (config === undefined) return false;
    if (!config.served) {
      if (config.reason === 'AlreadyServed') {
        log.bootFiles(
          'machine %s: the config of its network boot was fetched again, by %s, after it was served to %s: refused, and the boot fails%s',
          config.machineId,
          from,
          config.servedTo,
          config.distrusted ? '; the agent its token enrolled is trusted no more' : '',
        );
      } else {
        log.bootFiles(
          'machine %s: the config of its network boot was fetched by %s while no boot waits for it: refused',
          config.machineId,
          from,
        );
      }
      response.writeHead(410, { 'content-type': 'text/plain; charset=utf-8' }).end('gone\n');
      return true;
    }
    const archive = agentEnrollmentArchive({
      init: fromBinary(TakeoverInitSchema, config.takeoverInit),
      token: config.token.token,
      flags: config.agentFlags,
    });
    response.writeHead(200, {
      'content-type': contentType('config.cpio'),
      'content-length': archive.length,
      'cache-control': 'no-store',
    });
    response.end(archive);
    log.bootFiles('machine %s: config.cpio of its network boot served to %s', config.machineId, from);
    return true;
  }

  async #answerIpxe(
    macParameter: string | null,
    request: IncomingMessage,
    response: ServerResponse,
    from: string,
  ): Promise<void> {
    const mac = macParameter === null ? undefined : normalizeMac(macParameter);
    const boots = mac === undefined ? [] : await liveNetworkBootsByMac(this.#db, mac);
    const [boot, other] = boots;
    let script: string;
    if (mac === undefined) {
      log.bootFiles('%s asked for an iPXE script without a MAC address (its DHCP boot URL lacks ?mac=)', from);
      script = noAgentBootScript('no MAC address in the request: the DHCP boot URL needs ?mac= and net0/mac');
    } else if (boot === undefined) {
      log.bootFiles('%s asked for the iPXE script of MAC %s: no network boot waits for it', from, mac);
      script = noAgentBootScript(`no agent boot is prepared for MAC ${mac}; going on to the next boot device`);
    } else if (other !== undefined) {
      log.bootFiles(
        '%s asked for the iPXE script of MAC %s, which machines %s and %s both have (check the inventory): none answered',
        from,
        mac,
        boot.machineId,
        other.machineId,
      );
      script = noAgentBootScript(`MAC ${mac} is several machines' in the inventory; no agent boot`);
    } else {
      log.bootFiles('machine %s: iPXE script for MAC %s to %s', boot.machineId, mac, from);
      script = this.#script(boot.capability);
    }
    // 200 even for no boot: iPXE runs no script from an error response, and this one says why on the console.
    sendText(request, response, script);
  }
}

/** A new boot's capability: 32 random bytes, base64url (43 characters). */
export function newCapability(): string {
  return randomBytes(CAPABILITY_BYTES).toString('base64url');
}

/** An iPXE script, never cached. */
function sendText(request: IncomingMessage, response: ServerResponse, text: string): void {
  response.writeHead(200, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
  });
  response.end(request.method === 'HEAD' ? undefined : text);
}

/**
 * A request target's path under `/agent-boot/` (`''` for any other) and its query, from a
 * path or a full URL (HTTP/1.1 servers must take both); undefined for `*` and what no URL parser takes.
 */
function routeOf(target: string): { path: string; query: URLSearchParams } | undefined {
  const absolute = /^https?:\/\//i.test(target);
  if (!absolute && (!target.startsWith('/') || target.startsWith('//'))) return undefined;
  let url: URL;
  try {
    url = absolute ? new URL(target) : new URL(target, 'http://agent-boot.invalid');
  } catch {
    return undefined;
  }
  const path = url.pathname.startsWith(`${PREFIX}/`) ? url.pathname.slice(PREFIX.length + 1) : '';
  return { path, query: url.searchParams };
}

function contentType(file: string): string {
  if (file.endsWith('.iso')) return 'application/x-iso9660-image';
  return 'application/octet-stream';
}

function describeSent(sent: FileSent): string {
  const what = sent.range === undefined ? `${sent.status}` : `${sent.status} bytes ${sent.range}`;
  return sent.brokenOff ? `${what}, broken off` : what;
}

/** The public URL as a base to append paths to: http(s), a host, no path, query or fragment. */
function checkedPublicUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new AgentBootFilesError(
      undefined,
      `public URL ${JSON.stringify(text)} is not a URL (want https://host:port)`,
    );
  }
  if (
    (url.protocol !== 'http:' && url.protocol !== 'https:') ||
    url.pathname !== '/' ||
    url.search ||
    url.hash ||
    url.username
  ) {
    throw new AgentBootFilesError(
      undefined,
      `public URL ${JSON.stringify(text)}: want http(s)://host[:port] with no path, query or credentials`,
    );
  }
  return url.origin;
}
