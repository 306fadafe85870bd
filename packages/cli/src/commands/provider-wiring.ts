import path from 'node:path';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { DummyProvider, HeartbeatSimulator } from '@bmaas/provider-dummy';
import { EquinixClient, EquinixPower, EquinixProvider, EquinixStatusUpdater } from '@bmaas/provider-equinix';
import { IpmiClient, RedfishClient, StaticProvider } from '@bmaas/provider-static';
import {
  type AgentBootControl,
  type PowerControl,
  type Provider,
  Ssh2Client,
  type SshClient,
  SshKey,
} from '@bmaas/shepherd-manager';
import type { Registry } from 'prom-client';
import { ensureDirectory } from '../directory.js';
import { log } from '../logging.js';
import { type Argv, sshKeyFlag } from '../settings.js';
import { agentStartRecorder } from './agent-start-log.js';
import type {
  DummySettings,
  EquinixApiSettings,
  EquinixSettings,
  RunSettings,
  StaticSettings,
} from './run-settings.js';

/** A piece of the shepherd running until the stop signal. */
export type Part = (signal: AbortSignal) => Promise<void>;

/**
 * One provider wired for the loops: the provider, its power control (the
 * recoverer's, with the wait after a power cycle its flags set), how to
 * reach its machines, and its own loop.
 */
export interface ProviderWiring {
  readonly provider: Provider;
  readonly power: PowerControl;
  /** The provider's agent boot through its machines' BMCs; `undefined` for a provider without (Equinix). */
  readonly agentBoot: (Provider & AgentBootControl) | undefined;
  /** Milliseconds the recoverer waits after a power cycle (`--equinix-reboot-wait`, `--static-reboot-wait`). */
  readonly powerCycleWait: number;
  readonly sshClient: SshClient;
  readonly providerLoop: Part;
}

/** A provider's power control for a power command, and what to close after. */
export interface PowerWiring {
  readonly power: PowerControl;
  close(): Promise<void>;
}

/** The power control of the provider `settings` name, as `run` wires it, without SSH or the provider's loop. */
export function wirePowerControl(settings: DummySettings | EquinixApiSettings | StaticSettings): PowerWiring {
  if (settings.kind === 'dummy') return { power: dummyProvider(settings), close: async () => {} };
  if (settings.kind === 'static') {
    const { provider, redfish } = staticProvider(settings);
    return { power: provider, close: () => redfish.close() };
  }
  return { power: new EquinixPower(equinixClient(settings)), close: async () => {} };
}

/** Builds the provider `settings.provider` names, with its SSH client and its own loop. */
export async function wireProvider(
  bmdb: BMDB,
  settings: RunSettings,
  registry: Registry,
  argv: Argv,
): Promise<ProviderWiring> {
  const { provider } = settings;
  if (provider.kind === 'dummy') return wireDummy(bmdb, provider);
  if (provider.kind === 'static') return wireStatic(bmdb, provider, settings.agent.sshUser);
  return wireEquinix(bmdb, provider, settings.agent.sshUser, registry, argv);
}

/** The dummy provider: its own pretend SSH and simulated power, and a heartbeat simulator as its loop. */
function wireDummy(bmdb: BMDB, own: DummySettings): ProviderWiring {
  const dummy = dummyProvider(own);
  const heartbeats = new HeartbeatSimulator(dummy, { interval: own.heartbeatInterval });
  return {
    provider: dummy,
    power: dummy,
    agentBoot: dummy,
    powerCycleWait: 0,
    sshClient: dummy.sshClient,
    providerLoop: (signal) => heartbeats.run(bmdb, { signal }),
  };
}

function dummyProvider(own: DummySettings): DummyProvider {
  const { agentStartLog } = own;
  return new DummyProvider({
    ...own,
    ...(agentStartLog === undefined ? {} : { onAgentStart: agentStartRecorder(agentStartLog) }),
  });
}

/** The static provider: an inventory whose BMCs control power; its loop keeps the inventory in the BMDB. */
async function wireStatic(bmdb: BMDB, own: StaticSettings, sshUser: string): Promise<ProviderWiring> {
  const key = await SshKey.loadOrGenerate(own.sshKeyPath);
  log(
    'SSH key %s (%s): the machines must let it in as %s (`shepherd ssh-key` prints it)',
    key.path,
    key.fingerprint,
    sshUser,
  );
  const { provider, redfish } = staticProvider(own);
  return {
    provider,
    power: provider,
    agentBoot: provider,
    powerCycleWait: own.powerCycleWait,
    sshClient: new Ssh2Client({ privateKey: key.privateKey, username: sshUser }),
    providerLoop: (signal) => provider.run(bmdb, { signal }).finally(() => redfish.close()),
  };
}

function staticProvider(own: StaticSettings): { provider: StaticProvider; redfish: RedfishClient } {
  const redfish = new RedfishClient({
    ca: own.redfishCa,
    timeout: own.redfishTimeout,
    concurrency: own.redfishConcurrency,
  });
  const provider = new StaticProvider({
    inventory: own.inventory,
    redfish,
    ipmi: new IpmiClient({ timeout: own.ipmiTimeout, concurrency: own.ipmiConcurrency }),
    defaultCredentials: { username: own.redfishUsername, passwordFile: own.redfishPasswordFile },
    defaultIpmiCredentials: { username: own.ipmiUsername, passwordFile: own.ipmiPasswordFile },
    resetType: own.redfishResetType,
  });
  return { provider, redfish };
}

/** The Equinix provider: devices from the Metal API; its loop is the status updater. */
async function wireEquinix(
  bmdb: BMDB,
  equinix: EquinixSettings,
  sshUser: string,
  registry: Registry,
  argv: Argv,
): Promise<ProviderWiring> {
  await ensureDirectory(sshKeyFlag(argv), path.dirname(equinix.sshKeyPath), 0o700);
  const key = await SshKey.loadOrGenerate(equinix.sshKeyPath);
  log('SSH key %s (%s)', key.path, key.fingerprint);
  const client = equinixClient(equinix, registry);
  const equinixProvider = new EquinixProvider({
    client,
    projectId: equinix.projectId,
    devicePrefix: equinix.devicePrefix,
    os: equinix.os,
    sshKeyLabel: equinix.sshKeyLabel,
    sshPublicKey: key.authorizedKey,
    useProjectKeys: equinix.useProjectKeys,
    reservationCacheTimeout: equinix.reservationCacheTimeout,
  });
  // Fails early on bad credentials or a wrong project.
  await equinixProvider.ensureSshKey();
  const updater = new EquinixStatusUpdater({ client, projectId: equinix.projectId });
  return {
    provider: equinixProvider,
    power: new EquinixPower(client),
    agentBoot: undefined,
    powerCycleWait: equinix.powerCycleWait,
    sshClient: new Ssh2Client({ privateKey: key.privateKey, username: sshUser }),
    providerLoop: (signal) => updater.run(bmdb, { signal }),
  };
}

function equinixClient(api: EquinixApiSettings, registry?: Registry): EquinixClient {
  return new EquinixClient({
    apiKey: api.apiKey,
    apiUsername: api.apiUsername,
    baseUrl: api.apiUrl,
    ...(registry === undefined ? {} : { metrics: registry }),
  });
}
