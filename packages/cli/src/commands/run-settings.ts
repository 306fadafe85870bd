import { existsSync } from 'node:fs';
import { access } from 'node:fs/promises';
import path from 'node:path';
import type { RateLimiter } from '@bmaas/bmdb-controlloop';
import { Secret } from '@bmaas/provider-equinix';
import {
  InventoryError,
  type InventoryMachine,
  InventorySource,
  RESET_TYPES,
  type ResetType,
} from '@bmaas/provider-static';
import type { AgentBootFilesLimits } from '@bmaas/shepherd-manager';
import { log } from '../logging.js';
import {
  type Argv,
  bundledTestAgent,
  type DatabaseSettings,
  databaseSettings,
  duration,
  envName,
  fileContents,
  hostPort,
  integer,
  type MetricsSettings,
  metricsSettings,
  noPlaceholder,
  oneOf,
  optional,
  pemCertificate,
  pemCertificates,
  rate,
  required,
  secretFile,
  share,
  sshKeyPath,
  timerDuration,
  UsageError,
} from '../settings.js';
import { type TlsSource, tlsFiles } from '../tls.js';
import { type WebSettings, webSettings } from '../web-settings.js';

export type ProviderKind = 'dummy' | 'equinix' | 'static';

/** Everything `shepherd run` needs, parsed and checked before anything is touched. */
export interface RunSettings {
  readonly database: DatabaseSettings;
  readonly metrics: MetricsSettings | undefined;
  /** The fleet page, when --web-listen is given. */
  readonly web: WebSettings | undefined;
  readonly agent: {
    /**
     * What the initializer uploads to machines it takes over through SSH.
     * Undefined only for `run static` whose inventory, as read at start, has
     * no machine with `agentBoot` `ssh`: no initializer runs then.
     */
    readonly executable: Uint8Array | undefined;
    readonly targetPath: string;
    readonly endpoint: string;
    readonly caCertificate: Uint8Array | undefined;
    readonly sshUser: string;
    readonly sshPort: number;
    readonly connectTimeout: number;
    readonly execTimeout: number;
  };
  readonly provisioner: {
    readonly maxCount: number;
    readonly reconcileLimiter: RateLimiter;
    readonly creationLimiter: RateLimiter;
    readonly chunkSize: number;
  };
  readonly initializer: { readonly claimLimiter: RateLimiter; readonly parallelism: number };
  readonly recoverer: {
    readonly claimLimiter: RateLimiter;
    readonly parallelism: number;
    readonly firstHeartbeatWithin: number;
    readonly heartbeatWithin: number;
    readonly installingHeartbeatWithin: number;
  };
  /** The agent booter and its boot files, when `--agent-boot-image-dir` is given. */
  readonly agentBoot: AgentBootSettings | undefined;
  /** The power sync, or `undefined` when `--power-sync-concurrency` is 0. */
  readonly powerSync: PowerSyncSettings | undefined;
  /** How long the initializer's and recoverer's work under way may go on after the stop signal. */
  readonly stopGracePeriod: number;
  readonly provider: DummySettings | EquinixSettings | StaticSettings;
}

/** Booting agents through the machines' BMCs: the image, where its files are served, how long enrollment may take. */
export interface AgentBootSettings {
  /** Holds `vmlinuz`, `initramfs` and `agent.iso` (checked at start). */
  readonly imageDir: string;
  readonly listen: { readonly host: string; readonly port: number };
  /** `--agent-boot-url`; `undefined`: the listening address. */
  readonly publicUrl: string | undefined;
  /** HTTPS: files given, or a self-signed certificate under the data directory; `undefined`: plain HTTP. */
  readonly tls: TlsSource | undefined;
  /** What the boot files' clients may hold of their server. */
  readonly limits: AgentBootFilesLimits;
  /** Milliseconds. */
  readonly enrollmentWithin: number;
  readonly claimLimiter: RateLimiter;
  readonly parallelism: number;
}

export interface PowerSyncSettings {
  readonly limiter: RateLimiter;
  readonly concurrency: number;
  /** Milliseconds. */
  readonly interval: number;
}

export interface DummySettings {
  readonly kind: 'dummy';
  readonly capacity: number;
  readonly agentFailureRate: number;
  readonly heartbeatFailureRate: number;
  readonly heartbeatInterval: number;
  readonly agentStartDuration: number;
  readonly agentStartLog: string | undefined;
}

/** What reaching the Equinix Metal API takes: `run equinix` and `power --provider Equinix` alike. */
export interface EquinixApiSettings {
  readonly kind: 'equinix';
  readonly apiUrl: string;
  readonly projectId: string;
  readonly apiUsername: string | undefined;
  readonly apiKey: Secret;
}

export interface EquinixSettings extends EquinixApiSettings {
  readonly sshKeyLabel: string;
  readonly devicePrefix: string;
  readonly os: string;
  readonly useProjectKeys: boolean;
  /** `--…-reboot-wait`: the recoverer's wait after a power cycle. */
  readonly powerCycleWait: number;
  readonly reservationCacheTimeout: number;
  readonly sshKeyPath: string;
}

export interface StaticSettings {
  readonly kind: 'static';
  /** Read once here, so a bad inventory stops the start (exit 2). */
  readonly inventory: InventorySource;
  readonly redfishUsername: string | undefined;
  readonly redfishPasswordFile: string | undefined;
  readonly ipmiUsername: string | undefined;
  readonly ipmiPasswordFile: string | undefined;
  /** PEM text of `--redfish-ca-file`. */
  readonly redfishCa: string | undefined;
  readonly redfishResetType: ResetType | undefined;
  readonly redfishTimeout: number;
  readonly redfishConcurrency: number;
  readonly ipmiTimeout: number;
  readonly ipmiConcurrency: number;
  /** `--…-reboot-wait`: the recoverer's wait after a power cycle. */
  readonly powerCycleWait: number;
  readonly sshKeyPath: string;
}

export async function runSettings(argv: Argv, kind: ProviderKind): Promise<RunSettings> {
  const context = `run ${kind}`;
  // Equinix takes every machine over through SSH; the static inventory says which of its machines (read below).
  const executablePath =
    optional(argv, 'agent-executable-path') ??
    (kind === 'dummy'
      ? bundledTestAgent()
      : kind === 'equinix'
        ? required(argv, 'agent-executable-path', context)
        : undefined);
  const executable =
    executablePath === undefined ? undefined : await fileContents('agent-executable-path', executablePath);
  const caPath = optional(argv, 'agent-endpoint-ca-certificate-path');
  return {
    database: databaseSettings(argv),
    metrics: metricsSettings(argv),
    web: webSettings(argv),
    agent: {
      executable,
      targetPath: absolutePath(required(argv, 'agent-target-path', context)),
      endpoint:
        kind === 'dummy'
          ? (optional(argv, 'agent-endpoint') ?? 'bmaas.invalid:443')
          : required(argv, 'agent-endpoint', context),
      caCertificate:
        caPath === undefined ? undefined : await pemCertificate('agent-endpoint-ca-certificate-path', caPath),
      sshUser: required(argv, 'agent-ssh-user', context),
      sshPort: integer(argv, 'agent-ssh-port', 1, 65535),
      connectTimeout: duration(argv, 'agent-ssh-connect-timeout'),
      execTimeout: duration(argv, 'agent-ssh-exec-timeout'),
    },
    provisioner: {
      maxCount: integer(argv, 'provisioner-max-machines', 0),
      reconcileLimiter: rate(argv, 'provisioner-reconciler-rate'),
      creationLimiter: rate(argv, 'provisioner-device-creation-rate'),
      chunkSize: integer(argv, 'provisioner-reservation-chunk-size', 1),
    },
    initializer: {
      claimLimiter: rate(argv, 'initializer-db-query-rate'),
      parallelism: integer(argv, 'initializer-loop-parallelism', 1, 1000),
    },
    recoverer: {
      claimLimiter: rate(argv, 'recoverer-db-query-rate'),
      parallelism: integer(argv, 'recoverer-loop-parallelism', 1, 1000),
      firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
      heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
      installingHeartbeatWithin: duration(argv, 'recoverer-installing-heartbeat-timeout'),
    },
    agentBoot: await agentBootSettings(argv, kind),
    powerSync: powerSyncSettings(argv),
    stopGracePeriod: duration(argv, 'stop-grace-period'),
    provider:
      kind === 'dummy'
        ? dummySettings(argv)
        : kind === 'equinix'
          ? equinixSettings(argv, context)
          : await runStaticSettings(argv, context, executable !== undefined),
  };

  function absolutePath(value: string): string {
    if (!value.startsWith('/'))
      throw UsageError.invalid('agent-target-path', value, 'an absolute path, e.g. /root/agent');
    return value;
  }
}

const AGENT_BOOT_TLS_FLAGS = { cert: 'agent-boot-tls-cert', key: 'agent-boot-tls-key' } as const;
/** What `shepherd agent-image build --out DIR` writes, and the boot files serve. */
const AGENT_IMAGE_FILES = ['vmlinuz', 'initramfs', 'agent.iso'] as const;

async function agentBootSettings(argv: Argv, kind: ProviderKind): Promise<AgentBootSettings | undefined> {
  const imageDir = optional(argv, 'agent-boot-image-dir');
  if (imageDir === undefined) return undefined;
  if (kind === 'equinix') {
    throw new UsageError(
      'agent-boot-image-dir',
      'not with the equinix provider: its machines get their OS from Equinix Metal, and their agent over SSH',
    );
  }
  const dir = path.resolve(imageDir);
  for (const file of AGENT_IMAGE_FILES) {
    try {
      await access(path.join(dir, file));
    } catch {
      throw UsageError.invalid(
        'agent-boot-image-dir',
        imageDir,
        `a directory holding ${AGENT_IMAGE_FILES.join(', ')} (shepherd agent-image build --out DIR): ${file} is missing`,
      );
    }
  }
  const listen = hostPort(argv, 'agent-boot-listen');
  if (listen === undefined) throw new UsageError('agent-boot-listen', 'required with --agent-boot-image-dir');
  const files = tlsFiles(argv, AGENT_BOOT_TLS_FLAGS, 'for --agent-boot-tls-self-signed or plain HTTP');
  const selfSigned = argv['agent-boot-tls-self-signed'] === true;
  if (files && selfSigned) {
    throw new UsageError(
      'agent-boot-tls-self-signed',
      'not with --agent-boot-tls-cert and --agent-boot-tls-key: one certificate or the other',
    );
  }
  return {
    imageDir: dir,
    listen,
    publicUrl: bootUrl(optional(argv, 'agent-boot-url')),
    tls:
      files ??
      (selfSigned
        ? { selfSignedDir: path.resolve(required(argv, 'data-dir', 'a self-signed certificate')), name: 'agent-boot' }
        : undefined),
    limits: {
      connections: integer(argv, 'agent-boot-max-connections', 1, 1_000_000),
      idleTimeout: timerDuration(argv, 'agent-boot-idle-timeout'),
    },
    enrollmentWithin: duration(argv, 'agent-boot-enrollment-timeout'),
    claimLimiter: rate(argv, 'agent-booter-db-query-rate'),
    parallelism: integer(argv, 'agent-booter-loop-parallelism', 1, 1000),
  };
}

/** `--agent-boot-url`: an http(s) URL with nothing after the host and port, since the paths are the server's. */
function bootUrl(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw UsageError.invalid('agent-boot-url', value, 'a URL such as https://shepherd.example:8081');
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.pathname !== '/' || url.search || url.hash) {
    throw UsageError.invalid('agent-boot-url', value, 'an http:// or https:// URL without a path');
  }
  return url.origin;
}

function powerSyncSettings(argv: Argv): PowerSyncSettings | undefined {
  const limiter = rate(argv, 'power-sync-rate');
  const concurrency = integer(argv, 'power-sync-concurrency', 0, 1000);
  const interval = duration(argv, 'power-sync-interval', { allowZero: true });
  return concurrency === 0 ? undefined : { limiter, concurrency, interval };
}

/**
 * The settings of the provider a power command acts through, from the same
 * flags as `run <kind>`: what controlling its machines' power takes (the
 * Equinix API without the SSH key and device flags).
 */
export async function powerProviderSettings(
  argv: Argv,
  kind: ProviderKind,
  context: string,
): Promise<DummySettings | EquinixApiSettings | StaticSettings> {
  if (kind === 'dummy') return dummySettings(argv);
  if (kind === 'equinix') return equinixApiSettings(argv, context);
  return (await staticSettings(argv, context)).settings;
}

function dummySettings(argv: Argv): DummySettings {
  return {
    kind: 'dummy',
    capacity: integer(argv, 'dummy-capacity', 0, 2 ** 24 - 1),
    agentFailureRate: share(argv, 'dummy-agent-failure-rate'),
    heartbeatFailureRate: share(argv, 'dummy-heartbeat-failure-rate'),
    heartbeatInterval: duration(argv, 'dummy-heartbeat-interval'),
    agentStartDuration: duration(argv, 'dummy-agent-start-duration', { allowZero: true }),
    agentStartLog: optionalPath(argv, 'dummy-agent-start-log'),
  };
}

function equinixApiSettings(argv: Argv, context: string): EquinixApiSettings {
  return {
    kind: 'equinix',
    apiUrl: required(argv, 'equinix-api-url', context),
    projectId: noPlaceholder('equinix-project-id', required(argv, 'equinix-project-id', context)),
    apiUsername: optional(argv, 'equinix-api-username'),
    apiKey: new Secret(required(argv, 'equinix-api-key', context)),
  };
}

function equinixSettings(argv: Argv, context: string): EquinixSettings {
  return {
    ...equinixApiSettings(argv, context),
    sshKeyLabel: noPlaceholder('equinix-ssh-key-label', required(argv, 'equinix-ssh-key-label', context)),
    devicePrefix: noPlaceholder('equinix-device-prefix', required(argv, 'equinix-device-prefix', context)),
    os: required(argv, 'equinix-os', context),
    useProjectKeys: argv['equinix-use-project-keys'] === true,
    powerCycleWait: duration(argv, 'equinix-reboot-wait'),
    reservationCacheTimeout: duration(argv, 'equinix-reservation-cache-timeout'),
    sshKeyPath: sshKeyPath(argv),
  };
}

/**
 * `run static`'s provider settings: as {@link staticSettings}, and the agent
 * executable is required only when a machine of the inventory arrives over
 * SSH (`agentBoot` `ssh`, the default), whose takeover uploads it.
 */
async function runStaticSettings(argv: Argv, context: string, hasExecutable: boolean): Promise<StaticSettings> {
  const { settings, machines } = await staticSettings(argv, context);
  const overSsh = machines.find((machine) => machine.agentBoot === 'ssh');
  if (overSsh !== undefined && !hasExecutable) {
    throw new UsageError(
      'agent-executable-path',
      `required for ${context}: machine ${overSsh.id} of the inventory ${settings.inventory.name} arrives over SSH (agentBoot ssh, the default), which uploads it (or set ${envName('agent-executable-path')})`,
    );
  }
  return settings;
}

/** The static provider's settings, and its inventory as read now: a bad one stops the start (exit 2). */
async function staticSettings(
  argv: Argv,
  context: string,
): Promise<{ settings: StaticSettings; machines: readonly InventoryMachine[] }> {
  const location = required(argv, 'inventory', context);
  const passwordFile = optional(argv, 'redfish-password-file');
  const ipmiPasswordFile = optional(argv, 'ipmi-password-file');
  const caFile = optional(argv, 'redfish-ca-file');
  const settings: StaticSettings = {
    kind: 'static',
    inventory: inventorySource(location),
    redfishUsername: optional(argv, 'redfish-username'),
    redfishPasswordFile:
      passwordFile === undefined ? undefined : await secretFile('redfish-password-file', passwordFile),
    ipmiUsername: optional(argv, 'ipmi-username'),
    ipmiPasswordFile:
      ipmiPasswordFile === undefined ? undefined : await secretFile('ipmi-password-file', ipmiPasswordFile),
    redfishCa: caFile === undefined ? undefined : await pemCertificates('redfish-ca-file', caFile),
    redfishResetType: oneOf(argv, 'redfish-reset-type', RESET_TYPES),
    redfishTimeout: duration(argv, 'redfish-timeout'),
    redfishConcurrency: integer(argv, 'redfish-concurrency', 1, 1000),
    ipmiTimeout: duration(argv, 'ipmi-timeout'),
    ipmiConcurrency: integer(argv, 'ipmi-concurrency', 1, 1000),
    powerCycleWait: duration(argv, 'static-reboot-wait', { allowZero: true }),
    sshKeyPath: sshKeyPath(argv),
  };
  try {
    const machines = await settings.inventory.read();
    log('inventory %s: %d machine(s)', settings.inventory.name, machines.length);
    return { settings, machines };
  } catch (error) {
    if (error instanceof InventoryError) throw new UsageError('inventory', error.message);
    throw error;
  }
}

function inventorySource(location: string): InventorySource {
  try {
    return new InventorySource(location);
  } catch (error) {
    if (error instanceof InventoryError) throw new UsageError('inventory', error.message);
    throw error;
  }
}

/** A file to write, whose directory must exist: checked with the other flags, before anything is touched. */
function optionalPath(argv: Argv, flag: string): string | undefined {
  const value = optional(argv, flag);
  if (value === undefined) return undefined;
  const file = path.resolve(value);
  if (!existsSync(path.dirname(file))) {
    throw UsageError.invalid(flag, value, 'a file in an existing directory');
  }
  return file;
}
