import path from 'node:path';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import { DummyProvider, HeartbeatSimulator } from '@bmaas/provider-dummy';
import { EquinixClient, EquinixProvider, EquinixStatusUpdater } from '@bmaas/provider-equinix';
import { RedfishClient, StaticProvider } from '@bmaas/provider-static';
import { type RebootingProvider, Ssh2Client, type SshClient, SshKey } from '@bmaas/shepherd-manager';
import type { Registry } from 'prom-client';
import { ensureDirectory } from '../directory.js';
import { log } from '../logging.js';
import { type Argv, sshKeyFlag } from '../settings.js';
import { agentStartRecorder } from './agent-start-log.js';
import type { DummySettings, EquinixSettings, RunSettings, StaticSettings } from './run-settings.js';

/** A piece of the shepherd running until the stop signal. */
export type Part = (signal: AbortSignal) => Promise<void>;

/** One provider wired for the three loops: the provider, how to reach its machines, and its own loop. */
export interface ProviderWiring {
  readonly provider: RebootingProvider;
  readonly sshClient: SshClient;
  readonly providerLoop: Part;
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

/** The dummy provider: its own pretend SSH, and a heartbeat simulator as its loop. */
function wireDummy(bmdb: BMDB, own: DummySettings): ProviderWiring {
  const { agentStartLog } = own;
  const dummy = new DummyProvider({
    ...own,
    ...(agentStartLog === undefined ? {} : { onAgentStart: agentStartRecorder(agentStartLog) }),
  });
  const heartbeats = new HeartbeatSimulator(dummy, { interval: own.heartbeatInterval });
  return {
    provider: dummy,
    sshClient: dummy.sshClient,
    providerLoop: (signal) => heartbeats.run(bmdb, { signal }),
  };
}

/** The static provider: an inventory rebooted over Redfish; its loop keeps the inventory in the BMDB. */
async function wireStatic(bmdb: BMDB, own: StaticSettings, sshUser: string): Promise<ProviderWiring> {
  const key = await SshKey.loadOrGenerate(own.sshKeyPath);
  log(
    'SSH key %s (%s): the machines must let it in as %s (`shepherd ssh-key` prints it)',
    key.path,
    key.fingerprint,
    sshUser,
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
  return {
    provider: staticProvider,
    sshClient: new Ssh2Client({ privateKey: key.privateKey, username: sshUser }),
    providerLoop: (signal) => staticProvider.run(bmdb, { signal }).finally(() => redfish.close()),
  };
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
  return {
    provider: equinixProvider,
    sshClient: new Ssh2Client({ privateKey: key.privateKey, username: sshUser }),
    providerLoop: (signal) => updater.run(bmdb, { signal }),
  };
}
