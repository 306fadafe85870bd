import type { BMDB } from '@bmaas/bmdb-controlloop';
import { Initializer, PowerSync, Provisioner, Recoverer } from '@bmaas/shepherd-manager';
import type { Registry } from 'prom-client';
import type { Argv } from '../settings.js';
import { logProviders } from './log-providers.js';
import { type Part, wireProvider } from './provider-wiring.js';
import type { RunSettings } from './run-settings.js';

/**
 * The shepherd's parts: provisioner, initializer and recoverer around one
 * provider, the power sync (unless turned off) and the provider's own loop;
 * each runs until the stop signal.
 */
export async function shepherdParts(
  bmdb: BMDB,
  settings: RunSettings,
  registry: Registry,
  argv: Argv,
): Promise<Part[]> {
  const { agent } = settings;
  const { provider, power, powerCycleWait, sshClient, providerLoop } = await wireProvider(
    bmdb,
    settings,
    registry,
    argv,
  );

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
  const recoverer = new Recoverer(power, {
    firstHeartbeatWithin: settings.recoverer.firstHeartbeatWithin,
    heartbeatWithin: settings.recoverer.heartbeatWithin,
    installingHeartbeatWithin: settings.recoverer.installingHeartbeatWithin,
    powerCycleWait,
  });
  const powerSync = settings.powerSync && new PowerSync(power, settings.powerSync);
  return [
    (signal) => provisioner.run(bmdb, { signal }),
    (signal) => initializer.run(bmdb, { ...settings.initializer, stopGracePeriod: settings.stopGracePeriod, signal }),
    (signal) => recoverer.run(bmdb, { ...settings.recoverer, stopGracePeriod: settings.stopGracePeriod, signal }),
    ...(powerSync ? [(signal: AbortSignal) => powerSync.run(bmdb, { signal })] : []),
    providerLoop,
  ];
}
