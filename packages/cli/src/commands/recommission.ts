import { NotRetiredError, recommissionMachines } from '@bmaas/bmdb-model';
import { withSession } from '../database.js';
import { log } from '../logging.js';
import { type Argv, actor, optional, UsageError } from '../settings.js';
import { machineTargets } from './machine-targets.js';

/**
 * `shepherd recommission --provider P --provider-id ID…`: brings retired
 * (decommissioned) machines back on purpose. Their retirement is forgotten,
 * so the provisioner of `shepherd run` brings each in again, as a new
 * machine, at its next pass if the provider still lists it. All or nothing:
 * a provider ID that is not retired (in service, or unknown) is bad input,
 * named with exit 2, and nothing is recommissioned.
 */
export async function recommission(argv: Argv, write: (text: string) => void): Promise<void> {
  const targets = machineTargets(argv, 'recommission', { machineIds: false });
  if (!('provider' in targets)) throw new UsageError('provider', 'required for recommission');
  const who = actor(argv);
  const why = optional(argv, 'reason')?.trim() || 'no reason given';
  await withSession(argv, 'shepherd-recommission', async (session) => {
    let recommissioned: Awaited<ReturnType<typeof recommissionMachines>>;
    try {
      recommissioned = await session.transact((q) => recommissionMachines(q, targets.provider, targets.providerIds));
    } catch (error) {
      if (error instanceof NotRetiredError) throw new UsageError('provider-id', error.message);
      throw error;
    }
    for (const machine of recommissioned) {
      log(
        'recommissioned %s %s (was machine %s) for %s: %s',
        machine.provider,
        machine.providerId,
        machine.machineId,
        who,
        why,
      );
      write(
        `recommissioned ${machine.provider} ${machine.providerId} (was machine ${machine.machineId}, retired ${machine.retiredAt.toISOString()}): the provisioner brings it in as a new machine while its provider lists it\n`,
      );
    }
  });
}
