import { randomBytes } from 'node:crypto';
import { access, chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AGENT_KERNEL_ARGUMENTS, agentEnrollmentArchive, configureAgentIso } from '@bmaas/agent';
import { describeError, type Secret } from '@bmaas/common';
import { type FileSent, sendFile } from './boot-files/file-response.js';
import { agentBootScript, noAgentBootScript, normalizeMac } from './boot-files/ipxe.js';
import { type AgentBootFilesLimits, agentBootFilesLimits, holdConnections } from './boot-files/limits.js';
import type { TakeoverInit } from './gen/cloud/agent/api/takeover_pb.js';
import { detail, log } from './internal.js';
import { ShepherdError } from './provider.js';

/** The agent image's files, as `shepherd agent-image build --out DIR` names them. */
const IMAGE_FILES = ['vmlinuz', 'initramfs', 'agent.iso'] as const;
/** A boot's files under its unguessable path. */
const BOOT_FILES = ['agent.iso', 'config.cpio', 'script.ipxe'] as const;
const PREFIX = '/agent-boot';

/** Where and how {@link AgentBootFiles} serves. */
export interface AgentBootFilesOptions {
  /** The directory `shepherd agent-image build --out DIR` wrote: `vmlinuz`, `initramfs`, `agent.iso`. */
  readonly imageDir: string;
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

/** One boot of one machine's agent, as {@link AgentBootFiles.prepare} takes it. */
export interface AgentBootRequest {
  readonly machineId: string;
  /** The machine's NIC MAC addresses its iPXE script is matched by (any case, colons or dashes); empty: none. */
  readonly macs: readonly string[];
  /** The takeover's settings the agent enrolls with: machine ID, BMaaS endpoint, its CA. */
  readonly init: TakeoverInit;
  /** This boot's enrollment token; it is written into the boot's config and nowhere else. */
  readonly token: Secret;
  /** The agent's flags (`--interval=10s`), written into the boot's config beside the token. */
  readonly flags?: readonly string[];
}

/** Where a machine's BMC or iPXE fetches its boot; the paths are unguessable, and hold the token's files. */
export interface PreparedAgentBoot {
  /** This boot's ISO (the image's, with this boot's config), for virtual media. */
  readonly isoUrl: string;
  /** This boot's config initramfs (`/etc/bmaas/enrollment.json`). */
  readonly configUrl: string;
  /** This boot's iPXE script (also answered at `/agent-boot/ipxe?mac=` for each of the machine's MACs). */
  readonly ipxeScriptUrl: string;
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

/** A prepared boot: its capability, its directory and its script. */
interface Boot {
  readonly machineId: string;
  readonly capability: string;
  readonly dir: string;
  readonly macs: readonly string[];
  readonly script: string;
}

/**
 * The HTTP(S) server a machine's BMC or iPXE boots the agent from: the agent
 * image (`/agent-boot/vmlinuz`, `/agent-boot/initramfs`, `/agent-boot/agent.iso`),
 * each boot's ISO, config initramfs and iPXE script under an unguessable path
 * (`/agent-boot/b/<capability>/...`), and `GET /agent-boot/ipxe?mac=...`, the
 * prepared script of the machine with that MAC. Files are answered in ranges
 * (BMCs fetch ISOs in pieces), with HEAD and ETag, streamed from disk. HTTP/1.1
 * alone: that is what BMCs and iPXE speak.
 *
 * It runs in the process that issues the enrollment tokens, so a token's plain
 * text stays in that process and this server's work directory (mode 0700, its
 * files 0600) until the boot is forgotten. Capabilities and tokens are never
 * logged; requests are, by machine, file and range.
 */
export class AgentBootFiles {
  readonly #server: Server;
  readonly #imageDir: string;
  readonly #workDir: string;
  readonly #publicUrl: string;
  readonly #byMachine = new Map<string, Boot>();
  readonly #byCapability = new Map<string, Boot>();
  /** MAC (lower case, colons) → the machine prepared with it last. */
  readonly #byMac = new Map<string, string>();
  /** Each machine's prepare and forget, in the order called. */
  readonly #queues = new Map<string, Promise<unknown>>();
  #closed = false;

  private constructor(server: Server, imageDir: string, workDir: string, publicUrl: string) {
    this.#server = server;
    this.#imageDir = imageDir;
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
      options.imageDir,
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
   * Makes one boot of a machine's agent: its config initramfs holding the
   * enrollment token (`agentEnrollmentArchive`), its ISO (the image's with
   * that config as `/boot/config.cpio`), and its iPXE script, under a new
   * unguessable path. A machine prepared before has that boot replaced: its
   * old URLs answer 404 from then on. Its MACs answer its script at
   * `/agent-boot/ipxe?mac=...`.
   *
   * @throws {@link AgentBootFilesError} naming the machine: a MAC that is not one, the ISO not made, or the server closed
   */
  prepare(boot: AgentBootRequest): Promise<PreparedAgentBoot> {
    return this.#inOrder(boot.machineId, () => this.#prepare(boot));
  }

  /** Removes a machine's boot (after its enrollment, or giving up): its files are gone, its URLs and MACs answer nothing. */
  forget(machineId: string): Promise<void> {
    return this.#inOrder(machineId, async () => {
      const boot = this.#byMachine.get(machineId);
      if (boot === undefined) return;
      await this.#remove(boot);
      log.bootFiles('forgot the agent boot of machine %s', machineId);
    });
  }

  /** Stops listening, ends open connections and removes every boot's files. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections();
    });
    await Promise.allSettled(this.#queues.values());
    this.#byMachine.clear();
    this.#byCapability.clear();
    this.#byMac.clear();
    await rm(this.#workDir, { recursive: true, force: true });
  }

  async #prepare(request: AgentBootRequest): Promise<PreparedAgentBoot> {
    const { machineId } = request;
    if (this.#closed) throw new AgentBootFilesError(machineId, 'agent boot files are closed');
    const macs = request.macs.map((mac) => {
      const normalized = normalizeMac(mac);
      if (normalized === undefined) {
        throw new AgentBootFilesError(
          machineId,
          `MAC address ${JSON.stringify(mac)} is not one (want aa:bb:cc:dd:ee:ff)`,
        );
      }
      return normalized;
    });
    const capability = randomBytes(32).toString('base64url');
    const dir = await mkdtemp(path.join(this.#workDir, 'boot-'));
    const urls = this.#bootUrls(capability);
    const script = agentBootScript(
      {
        kernel: `${this.#publicUrl}${PREFIX}/vmlinuz`,
        initramfs: `${this.#publicUrl}${PREFIX}/initramfs`,
        config: urls.configUrl,
      },
      AGENT_KERNEL_ARGUMENTS,
    );
    try {
      const config = path.join(dir, 'config.cpio');
      await writeFile(
        config,
        agentEnrollmentArchive({ init: request.init, token: request.token, flags: request.flags ?? [] }),
        {
          mode: 0o600,
        },
      );
      await writeFile(path.join(dir, 'script.ipxe'), script, { mode: 0o600 });
      const iso = path.join(dir, 'agent.iso');
      await configureAgentIso(path.join(this.#imageDir, 'agent.iso'), config, iso);
      await chmod(iso, 0o600);
    } catch (error) {
      await rm(dir, { recursive: true, force: true });
      throw new AgentBootFilesError(
        machineId,
        `cannot make its agent boot files: ${request.token.scrub(describeError(error))}`,
        {
          cause: error,
        },
      );
    }
    if (this.#closed) {
      await rm(dir, { recursive: true, force: true });
      throw new AgentBootFilesError(machineId, 'agent boot files are closed');
    }
    const previous = this.#byMachine.get(machineId);
    if (previous) await this.#remove(previous);
    const boot: Boot = { machineId, capability, dir, macs, script };
    this.#byMachine.set(machineId, boot);
    this.#byCapability.set(capability, boot);
    for (const mac of macs) {
      const other = this.#byMac.get(mac);
      if (other !== undefined && other !== machineId) {
        log.bootFiles(
          'MAC %s of machine %s was machine %s’s: its iPXE script is machine %s’s now',
          mac,
          machineId,
          other,
          machineId,
        );
      }
      this.#byMac.set(mac, machineId);
    }
    log.bootFiles(
      'prepared an agent boot of machine %s (ISO, config, iPXE script%s)',
      machineId,
      macs.length ? ` for ${macs.join(', ')}` : '',
    );
    return urls;
  }

  #bootUrls(capability: string): PreparedAgentBoot {
    const base = `${this.#publicUrl}${PREFIX}/b/${capability}`;
    return { isoUrl: `${base}/agent.iso`, configUrl: `${base}/config.cpio`, ipxeScriptUrl: `${base}/script.ipxe` };
  }

  async #remove(boot: Boot): Promise<void> {
    this.#byMachine.delete(boot.machineId);
    this.#byCapability.delete(boot.capability);
    for (const mac of boot.macs) {
      if (this.#byMac.get(mac) === boot.machineId) this.#byMac.delete(mac);
    }
    await rm(boot.dir, { recursive: true, force: true });
  }

  /** Runs `act` after the machine's earlier prepare or forget settled, so the last call wins. */
  #inOrder<T>(machineId: string, act: () => Promise<T>): Promise<T> {
    const previous = this.#queues.get(machineId) ?? Promise.resolve();
    const result = previous.then(act, act);
    const settled = result.then(
      () => undefined,
      () => undefined,
    );
    this.#queues.set(machineId, settled);
    void settled.then(() => {
      if (this.#queues.get(machineId) === settled) this.#queues.delete(machineId);
    });
    return result;
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
        this.#answerIpxe(route.query.get('mac'), request, response, from);
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
      const bootFile = /^b\/([A-Za-z0-9_-]{43})\/([a-z.]+)$/.exec(route.path);
      const boot = bootFile ? this.#byCapability.get(bootFile[1] ?? '') : undefined;
      const name = BOOT_FILES.find((file) => file === bootFile?.[2]);
      if (boot === undefined || name === undefined) {
        // Never the path: a capability mistyped by one character is still nearly one.
        detail.bootFiles(
          '%s asked for %s, which is not served',
          from,
          route.path.startsWith('b/') ? 'a boot file' : 'a path',
        );
        response.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
        return;
      }
      const sent = await sendFile(request, response, path.join(boot.dir, name), {
        contentType: contentType(name),
        cacheControl: 'no-store',
      });
      // A BMC reads an ISO in many ranges: one line each is a detail; the config and script are read once.
      (name === 'agent.iso' ? detail : log).bootFiles(
        'machine %s: %s %s to %s',
        boot.machineId,
        name,
        describeSent(sent),
        from,
      );
    } catch (error) {
      log.bootFiles('answering %s failed: %s', from, describeError(error));
      if (!response.headersSent) response.writeHead(500).end();
      else response.destroy();
    }
  }

  #answerIpxe(macParameter: string | null, request: IncomingMessage, response: ServerResponse, from: string): void {
    const mac = macParameter === null ? undefined : normalizeMac(macParameter);
    const machineId = mac === undefined ? undefined : this.#byMac.get(mac);
    const boot = machineId === undefined ? undefined : this.#byMachine.get(machineId);
    let script: string;
    if (mac === undefined) {
      log.bootFiles('%s asked for an iPXE script without a MAC address (its DHCP boot URL lacks ?mac=)', from);
      script = noAgentBootScript('no MAC address in the request: the DHCP boot URL needs ?mac= and net0/mac');
    } else if (boot === undefined) {
      log.bootFiles('%s asked for the iPXE script of MAC %s: no agent boot is prepared for it', from, mac);
      script = noAgentBootScript(`no agent boot is prepared for MAC ${mac}; going on to the next boot device`);
    } else {
      log.bootFiles('machine %s: iPXE script for MAC %s to %s', boot.machineId, mac, from);
      script = boot.script;
    }
    // 200 even for no boot: iPXE runs no script from an error response, and this one says why on the console.
    response.writeHead(200, {
      'content-type': 'text/plain; charset=utf-8',
      'content-length': Buffer.byteLength(script),
      'cache-control': 'no-store',
    });
    response.end(request.method === 'HEAD' ? undefined : script);
  }
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
  if (file.endsWith('.ipxe')) return 'text/plain; charset=utf-8';
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
