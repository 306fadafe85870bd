import { existsSync, openSync, writeSync } from 'node:fs';
import type { Server } from 'node:http';
import path from 'node:path';
import { type BMDB, Queries, type RateLimiter } from '@bmaas/bmdb-controlloop';
import { type AgentStartEvent, DummyProvider, HeartbeatSimulator } from '@bmaas/provider-dummy';
import { EquinixClient, EquinixProvider, EquinixStatusUpdater, Secret } from '@bmaas/provider-equinix';
import {
  InventoryError,
  InventorySource,
  RESET_TYPES,
  RedfishClient,
  type ResetType,
  StaticProvider,
} from '@bmaas/provider-static';
import {
  Initializer,
  Provisioner,
  type RebootingProvider,
  Recoverer,
  Ssh2Client,
  type SshClient,
  SshKey,
} from '@bmaas/shepherd-manager';
import type { FleetPageServer } from '@bmaas/web';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { openBMDB } from '../database.js';
import { ensureDirectory } from '../directory.js';
import { log } from '../logging.js';
import { closeServer, serveMetrics } from '../metrics-server.js';
import {
  type Argv,
  bundledTestAgent,
  type DatabaseSettings,
  databaseSettings,
  duration,
  fileContents,
  hostPort,
  integer,
  noPlaceholder,
  oneOf,
  optional,
  pemCertificate,
  pemCertificates,
  rate,
  required,
  secretFile,
  share,
  sshKeyFlag,
  sshKeyPath,
  UsageError,
  type WebSettings,
  webSettings,
} from '../settings.js';
import { serveWeb } from './web.js';

export type ProviderKind = 'dummy' | 'equinix' | 'static';

/** Everything `shepherd run` needs, parsed and checked before anything is touched. */
interface RunSettings {
  readonly database: DatabaseSettings;
  readonly metricsListen: { host: string; port: number } | undefined;
  /** The fleet page, when --web-listen is given. */
  readonly web: WebSettings | undefined;
  readonly agent: {
    readonly executable: Uint8Array;
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
  readonly initializer: { readonly dbQueryLimiter: RateLimiter; readonly parallelism: number };
  readonly recoverer: {
    readonly dbQueryLimiter: RateLimiter;
    readonly parallelism: number;
    readonly firstHeartbeatWithin: number;
    readonly heartbeatWithin: number;
  };
  readonly provider: DummySettings | EquinixSettings | StaticSettings;
}

interface DummySettings {
  readonly kind: 'dummy';
  readonly capacity: number;
  readonly agentFailureRate: number;
  readonly heartbeatFailureRate: number;
  readonly heartbeatInterval: number;
  readonly agentStartDuration: number;
  readonly agentStartLog: string | undefined;
}

interface EquinixSettings {
  readonly kind: 'equinix';
  readonly apiUrl: string;
  readonly projectId: string;
  readonly apiUsername: string | undefined;
  readonly apiKey: Secret;
  readonly sshKeyLabel: string;
  readonly devicePrefix: string;
  readonly os: string;
  readonly useProjectKeys: boolean;
  readonly rebootWait: number;
  readonly reservationCacheTimeout: number;
  readonly sshKeyPath: string;
}

interface StaticSettings {
  readonly kind: 'static';
  /** Read once here, so a bad inventory stops the start (exit 2). */
  readonly inventory: InventorySource;
  readonly redfishUsername: string | undefined;
  readonly redfishPasswordFile: string | undefined;
  /** PEM text of `--redfish-ca-file`. */
  readonly redfishCa: string | undefined;
  readonly redfishResetType: ResetType | undefined;
  readonly redfishTimeout: number;
  readonly redfishConcurrency: number;
  readonly rebootWait: number;
  readonly sshKeyPath: string;
}

export async function runSettings(argv: Argv, kind: ProviderKind): Promise<RunSettings> {
  const context = `run ${kind}`;
  const executablePath = optional(argv, 'agent-executable-path') ?? (kind === 'dummy' ? bundledTestAgent() : undefined);
  const caPath = optional(argv, 'agent-endpoint-ca-certificate-path');
  return {
    database: databaseSettings(argv),
    metricsListen: hostPort(argv, 'metrics-listen'),
    web: webSettings(argv),
    agent: {
      executable: await fileContents(
        'agent-executable-path',
        executablePath ?? required(argv, 'agent-executable-path', context),
      ),
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
      dbQueryLimiter: rate(argv, 'initializer-db-query-rate'),
      parallelism: integer(argv, 'initializer-loop-parallelism', 1, 1000),
    },
    recoverer: {
      dbQueryLimiter: rate(argv, 'recoverer-db-query-rate'),
      parallelism: integer(argv, 'recoverer-loop-parallelism', 1, 1000),
      firstHeartbeatWithin: duration(argv, 'recoverer-first-heartbeat-timeout'),
      heartbeatWithin: duration(argv, 'recoverer-heartbeat-timeout'),
    },
    provider:
      kind === 'dummy'
        ? dummySettings(argv)
        : kind === 'equinix'
          ? equinixSettings(argv, context)
          : await staticSettings(argv, context),
  };

  function absolutePath(value: string): string {
    if (!value.startsWith('/'))
      throw UsageError.invalid('agent-target-path', value, 'an absolute path, e.g. /root/agent');
    return value;
  }
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

function equinixSettings(argv: Argv, context: string): EquinixSettings {
  return {
    kind: 'equinix',
    apiUrl: required(argv, 'equinix-api-url', context),
    projectId: noPlaceholder('equinix-project-id', required(argv, 'equinix-project-id', context)),
    apiUsername: optional(argv, 'equinix-api-username'),
    apiKey: new Secret(required(argv, 'equinix-api-key', context)),
    sshKeyLabel: noPlaceholder('equinix-ssh-key-label', required(argv, 'equinix-ssh-key-label', context)),
    devicePrefix: noPlaceholder('equinix-device-prefix', required(argv, 'equinix-device-prefix', context)),
    os: required(argv, 'equinix-os', context),
    useProjectKeys: argv['equinix-use-project-keys'] === true,
    rebootWait: duration(argv, 'equinix-reboot-wait'),
    reservationCacheTimeout: duration(argv, 'equinix-reservation-cache-timeout'),
    sshKeyPath: sshKeyPath(argv),
  };
}

async function staticSettings(argv: Argv, context: string): Promise<StaticSettings> {
  const location = required(argv, 'inventory', context);
  const passwordFile = optional(argv, 'redfish-password-file');
  const caFile = optional(argv, 'redfish-ca-file');
  const settings: StaticSettings = {
    kind: 'static',
    inventory: inventorySource(location),
    redfishUsername: optional(argv, 'redfish-username'),
    redfishPasswordFile:
      passwordFile === undefined ? undefined : await secretFile('redfish-password-file', passwordFile),
    redfishCa: caFile === undefined ? undefined : await pemCertificates('redfish-ca-file', caFile),
    redfishResetType: oneOf(argv, 'redfish-reset-type', RESET_TYPES),
    redfishTimeout: duration(argv, 'redfish-timeout'),
    redfishConcurrency: integer(argv, 'redfish-concurrency', 1, 1000),
    rebootWait: duration(argv, 'static-reboot-wait', { allowZero: true }),
    sshKeyPath: sshKeyPath(argv),
  };
  try {
    const machines = await settings.inventory.read();
    log('inventory %s: %d machine(s)', settings.inventory.name, machines.length);
  } catch (error) {
    if (error instanceof InventoryError) throw new UsageError('inventory', error.message);
    throw error;
  }
  return settings;
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

/**
 * `--dummy-agent-start-log`: one JSON line per fake agent start event,
 * appended (O_APPEND, one write each) so several shepherds can share a file,
 * and written synchronously so a line is on record before anything else
 * happens, even if the process is killed right after.
 */
function agentStartRecorder(file: string): (event: AgentStartEvent) => void {
  let fd: number;
  try {
    // Kept open for the process's life; the kernel closes it at exit.
    fd = openSync(file, 'a');
  } catch (error) {
    const reason = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
    throw new UsageError('dummy-agent-start-log', `cannot open ${JSON.stringify(file)} for appending (${reason})`);
  }
  return (event) => {
    const line = JSON.stringify({
      phase: event.phase,
      machine: event.machineId ?? null,
      address: event.address,
      ...(event.outcome === undefined ? {} : { outcome: event.outcome }),
      pid: process.pid,
      at: event.at.toISOString(),
    });
    writeSync(fd, `${line}\n`);
  };
}

/**
 * Says at start how many machines of this shepherd's provider the BMDB holds,
 * and which other providers' machines it leaves alone: a machine recorded
 * under a provider no shepherd runs waits forever, and this is where an
 * operator sees it.
 */
async function logProviders(bmdb: BMDB, type: string): Promise<void> {
  const counts = await new Queries(bmdb.db).machinesPerProvider();
  const ours = counts[type] ?? 0;
  const others = Object.entries(counts)
    .filter(([provider]) => provider !== type)
    .map(([provider, machines]) => `${provider} ${machines}`);
  log(
    'the BMDB holds %s machine(s) of provider %s%s',
    ours,
    type,
    others.length === 0 ? '' : `; machines of other providers, left alone by this shepherd: ${others.join(', ')}`,
  );
}

/** A piece of the shepherd running until the stop signal. */
type Part = (signal: AbortSignal) => Promise<void>;

/**
 * `shepherd run <provider>`: provisioner, initializer and recoverer (and the
 * provider's own loop) in one process until SIGINT/SIGTERM, then a clean stop:
 * no work left claimed, sessions closed, the embedded database stopped. A
 * second signal exits at once.
 */
export async function run(argv: Argv, kind: ProviderKind): Promise<void> {
  // Signals count from the first moment: start-up may be stuck reading a file or creating a directory.
  const stop = new AbortController();
  let running = false;
  let stoppedBy: NodeJS.Signals | undefined;
  const onSignal = (signal: NodeJS.Signals) => {
    stoppedBy ??= signal;
    if (stop.signal.aborted) {
      log('second %s: exiting at once', signal);
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    log(
      running
        ? '%s: stopping cleanly (no new work, in-flight work ends, sessions close); send it again to exit at once'
        : '%s: stopping start-up; send it again to exit at once',
      signal,
    );
    stop.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  // Start-up steps a signal made us stop waiting for, until they settle.
  const abandoned = new Set<Promise<unknown>>();
  const untilStopped = <T>(step: Promise<T>): Promise<T> => {
    const settled = () => abandoned.delete(step);
    return raceSignal(step, stop.signal, () => {
      abandoned.add(step);
      step.then(settled, settled);
    });
  };
  let bmdb: BMDB | undefined;
  let metricsServer: Server | undefined;
  log('starting with the %s provider', kind);
  let webServer: FleetPageServer | undefined;
  try {
    const settings = await untilStopped(runSettings(argv, kind));
    if (settings.database.url === undefined) {
      await untilStopped(ensureDirectory('data-dir', settings.database.dataDir));
    }
    const registry = new Registry();
    collectDefaultMetrics({ register: registry });
    if (settings.metricsListen) metricsServer = await serveMetrics(registry, settings.metricsListen);
    // Not abandoned on a signal: it may be starting a server, which the `finally` must stop.
    bmdb = await openBMDB(settings.database, { migrate: true, metrics: registry });
    if (stop.signal.aborted) throw new StartupStopped();
    if (settings.web) webServer = await serveWeb(bmdb, settings.web, settings.recoverer);
    const parts = await untilStopped(shepherdParts(bmdb, settings, registry, argv));
    running = true;
    log(
      'running with the %s provider (%s); %s',
      kind,
      settings.database.url === undefined ? `embedded BMDB in ${settings.database.dataDir}` : 'BMDB at --bmdb-url',
      metricsServer
        ? `metrics at ${settings.metricsListen?.host}:${settings.metricsListen?.port}`
        : 'no metrics endpoint',
    );
    await Promise.all(parts.map((part) => part(stop.signal)));
    log('stopped');
  } catch (error) {
    if (!(error instanceof StartupStopped)) throw error;
    log('stopped during start-up');
  } finally {
    await webServer?.close();
    await bmdb?.close();
    if (metricsServer) await closeServer(metricsServer);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    if (abandoned.size > 0 && stoppedBy) {
      // Most abandoned steps end soon (a query on the closed BMDB, an HTTP request). A call
      // stuck in the file system (a FIFO, a hung mount) holds a thread that even
      // process.exit() waits for; the signal's own default action ends the process.
      await settledWithin([...abandoned], ABANDONED_GRACE);
      if (abandoned.size > 0) {
        log('start-up is still waiting on the file system: ending the process by %s', stoppedBy);
        process.kill(process.pid, stoppedBy);
      }
    }
  }
}

/** How long start-up steps abandoned on a stop signal may take to end on their own. */
const ABANDONED_GRACE = 1_000;

async function settledWithin(steps: Promise<unknown>[], ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    Promise.allSettled(steps),
    new Promise((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

/** A stop signal came before the shepherd was running. */
class StartupStopped extends Error {
  override name = 'StartupStopped';
  constructor() {
    super('stopped during start-up');
  }
}

/**
 * `step`, or a {@link StartupStopped} as soon as `signal` aborts (calling
 * `onAbandon`). What the step was waiting for (a file read, a directory
 * created, an HTTP request) is abandoned: a file system that never answers
 * must not keep the process.
 */
function raceSignal<T>(step: Promise<T>, signal: AbortSignal, onAbandon: () => void): Promise<T> {
  if (signal.aborted) {
    onAbandon();
    return Promise.reject(new StartupStopped());
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      onAbandon();
      reject(new StartupStopped());
    };
    signal.addEventListener('abort', onAbort, { once: true });
    step.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error);
      },
    );
  });
}

async function shepherdParts(bmdb: BMDB, settings: RunSettings, registry: Registry, argv: Argv): Promise<Part[]> {
  const { agent } = settings;
  let provider: RebootingProvider;
  let sshClient: SshClient;
  let providerLoop: Part;
  if (settings.provider.kind === 'dummy') {
    const { agentStartLog } = settings.provider;
    const dummy = new DummyProvider({
      ...settings.provider,
      ...(agentStartLog === undefined ? {} : { onAgentStart: agentStartRecorder(agentStartLog) }),
    });
    const heartbeats = new HeartbeatSimulator(dummy, { interval: settings.provider.heartbeatInterval });
    provider = dummy;
    sshClient = dummy.sshClient;
    providerLoop = (signal) => heartbeats.run(bmdb, { signal });
  } else if (settings.provider.kind === 'static') {
    const own = settings.provider;
    const key = await SshKey.loadOrGenerate(own.sshKeyPath);
    log(
      'SSH key %s (%s): the machines must let it in as %s (`shepherd ssh-key` prints it)',
      key.path,
      key.fingerprint,
      agent.sshUser,
    );
    const redfish = new RedfishClient({
      ca: own.redfishCa,
      timeout: own.redfishTimeout,
      concurrency: own.redfishConcurrency,
    });
    const staticProvider = new StaticProvider({
      inventory: own.inventory,
      redfish,
      defaultCredentials: { username: own.redfishUsername, passwordFile: own.redfishPasswordFile },
      resetType: own.redfishResetType,
      rebootWait: own.rebootWait,
    });
    provider = staticProvider;
    sshClient = new Ssh2Client({ privateKey: key.privateKey, username: agent.sshUser });
    providerLoop = (signal) => staticProvider.run(bmdb, { signal }).finally(() => redfish.close());
  } else {
    const equinix = settings.provider;
    await ensureDirectory(sshKeyFlag(argv), path.dirname(equinix.sshKeyPath), 0o700);
    const key = await SshKey.loadOrGenerate(equinix.sshKeyPath);
    log('SSH key %s (%s)', key.path, key.fingerprint);
    const client = new EquinixClient({
      apiKey: equinix.apiKey,
      apiUsername: equinix.apiUsername,
      baseUrl: equinix.apiUrl,
      metrics: registry,
    });
    const equinixProvider = new EquinixProvider({
      client,
      projectId: equinix.projectId,
      devicePrefix: equinix.devicePrefix,
      os: equinix.os,
      sshKeyLabel: equinix.sshKeyLabel,
      sshPublicKey: key.authorizedKey,
      useProjectKeys: equinix.useProjectKeys,
      rebootWait: equinix.rebootWait,
      reservationCacheTimeout: equinix.reservationCacheTimeout,
    });
    // Fails early on bad credentials or a wrong project.
    await equinixProvider.ensureSshKey();
    const updater = new EquinixStatusUpdater({ client, projectId: equinix.projectId });
    provider = equinixProvider;
    sshClient = new Ssh2Client({ privateKey: key.privateKey, username: agent.sshUser });
    providerLoop = (signal) => updater.run(bmdb, { signal });
  }

  await logProviders(bmdb, provider.type);
  const provisioner = new Provisioner(provider, settings.provisioner);
  const initializer = new Initializer(provider, {
    agentExecutable: agent.executable,
    agentTargetPath: agent.targetPath,
    agentEndpoint: agent.endpoint,
    ...(agent.caCertificate ? { agentEndpointCaCertificate: agent.caCertificate } : {}),
    sshClient,
    sshPort: agent.sshPort,
    sshConnectTimeout: agent.connectTimeout,
    sshExecTimeout: agent.execTimeout,
  });
  const recoverer = new Recoverer(provider, {
    firstHeartbeatWithin: settings.recoverer.firstHeartbeatWithin,
    heartbeatWithin: settings.recoverer.heartbeatWithin,
  });
  return [
    (signal) => provisioner.run(bmdb, { signal }),
    (signal) => initializer.run(bmdb, { ...settings.initializer, signal }),
    (signal) => recoverer.run(bmdb, { ...settings.recoverer, signal }),
    providerLoop,
  ];
}
