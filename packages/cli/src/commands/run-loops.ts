import type { BMDB } from '@bmaas/bmdb-controlloop';
import {
  type AgentBootControl,
  AgentBooter,
  AgentBootFiles,
  Initializer,
  PowerSync,
  type Provider,
  Provisioner,
  Recoverer,
} from '@bmaas/shepherd-manager';
import type { Registry } from 'prom-client';
import { log } from '../logging.js';
import type { Argv } from '../settings.js';
import { loadTls } from '../tls.js';
import { logProviders } from './log-providers.js';
import { type Part, wireProvider } from './provider-wiring.js';
import type { AgentBootSettings, RunSettings } from './run-settings.js';

/**
 * The shepherd's parts: provisioner, initializer (when there is an agent
 * executable to upload) and recoverer around one provider, the agent booter with its boot files (with
 * `--agent-boot-image-dir`), the power sync (unless turned off) and the
 * provider's own loop; each runs until the stop signal.
 */
export async function shepherdParts(
  bmdb: BMDB,
  settings: RunSettings,
  registry: Registry,
  argv: Argv,
): Promise<Part[]> {
  const { agent } = settings;
  const { provider, power, agentBoot, powerCycleWait, sshClient, providerLoop } = await wireProvider(
    bmdb,
    settings,
    registry,
    argv,
  );

  await logProviders(bmdb, provider.type);
  const provisioner = new Provisioner(provider, settings.provisioner);
  const initializer =
    agent.executable &&
    new Initializer(provider, {
      agentExecutable: agent.executable,
      agentTargetPath: agent.targetPath,
      agentEndpoint: agent.endpoint,
      ...(agent.caCertificate ? { agentEndpointCaCertificate: agent.caCertificate } : {}),
      sshClient,
      sshPort: agent.sshPort,
      sshConnectTimeout: agent.connectTimeout,
      sshExecTimeout: agent.execTimeout,
    });
  if (!initializer) {
    log(
      'no initializer: no --agent-executable-path, and no machine of the inventory arrives over SSH (one added with agentBoot ssh waits for a start with the flag)',
    );
  }
  const recoverer = new Recoverer(power, {
    firstHeartbeatWithin: settings.recoverer.firstHeartbeatWithin,
    heartbeatWithin: settings.recoverer.heartbeatWithin,
    installingHeartbeatWithin: settings.recoverer.installingHeartbeatWithin,
    powerCycleWait,
  });
  const powerSync = settings.powerSync && new PowerSync(power, settings.powerSync);
  const booter =
    settings.agentBoot && agentBoot && (await agentBooterPart(bmdb, settings, settings.agentBoot, agentBoot));
  return [
    (signal) => provisioner.run(bmdb, { signal }),
    ...(initializer
      ? [
          (signal: AbortSignal) =>
            initializer.run(bmdb, { ...settings.initializer, stopGracePeriod: settings.stopGracePeriod, signal }),
        ]
      : []),
    (signal) => recoverer.run(bmdb, { ...settings.recoverer, stopGracePeriod: settings.stopGracePeriod, signal }),
    ...(booter ? [booter] : []),
    ...(powerSync ? [(signal: AbortSignal) => powerSync.run(bmdb, { signal })] : []),
    providerLoop,
  ];
}

/**
 * The agent booter, and the boot files served from this process until it
 * stops: its own virtual media boots' ISOs (where their tokens are made), and
 * every network boot armed in the BMDB, whichever process claimed it.
 */
async function agentBooterPart(
  bmdb: BMDB,
  settings: RunSettings,
  own: AgentBootSettings,
  provider: Provider & AgentBootControl,
): Promise<Part> {
  const tls = own.tls && (await loadTls(own.tls));
  const files = await AgentBootFiles.start({
    imageDir: own.imageDir,
    db: bmdb.db,
    listen: own.listen,
    publicUrl: own.publicUrl,
    limits: own.limits,
    ...(tls ? { tls: { cert: tls.cert, key: tls.key } } : {}),
  });
  log('agent boot files at %s (image %s)', files.url, own.imageDir);
  const booter = new AgentBooter(provider, files, {
    agentEndpoint: settings.agent.endpoint,
    agentEndpointCaCertificate: settings.agent.caCertificate,
    enrollmentWithin: own.enrollmentWithin,
    firstHeartbeatWithin: settings.recoverer.firstHeartbeatWithin,
    heartbeatWithin: settings.recoverer.heartbeatWithin,
    installingHeartbeatWithin: settings.recoverer.installingHeartbeatWithin,
  });
  return (signal) =>
    booter
      .run(bmdb, {
        claimLimiter: own.claimLimiter,
        parallelism: own.parallelism,
        stopGracePeriod: settings.stopGracePeriod,
        signal,
      })
      .finally(() => files.close());
}
