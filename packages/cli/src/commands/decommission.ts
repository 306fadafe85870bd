import type { DecommissionReport } from '@bmaas/bmdb-controlloop';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { type Argv, databaseSettings, required, UsageError } from '../settings.js';
import { listFlag } from './machine-targets.js';

/** The machines `shepherd decommission` removed and refused. */
export class DecommissionRefusedError extends Error {
  override name = 'DecommissionRefusedError';
}

/**
 * `shepherd decommission --provider P --provider-id ID…`: removes machines
 * from the BMDB (their tags and backoffs; their work history stays), for
 * machines gone for good at their provider. Machines with live work are
 * refused and left alone; so are IDs the BMDB does not know. Exits 1 if any
 * was refused, after removing the others.
 */
export async function decommission(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings = decommissionSettings(argv);
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, attach: true });
  try {
    const session = await bmdb.startSession({ processor: 'shepherd-decommission' });
    let report: DecommissionReport;
    try {
      report = await session.transact((q) => q.decommissionMachines(settings.provider, settings.providerIds));
    } finally {
      await session.close();
    }
    for (const { providerId, machineId } of report.removed) {
      log('decommissioned machine %s (provider %s, provider ID %s)', machineId, settings.provider, providerId);
      write(`removed ${settings.provider} ${providerId} (machine ${machineId})\n`);
    }
    const refusals: string[] = [];
    for (const { providerId, machineId, processes } of report.busy) {
      refusals.push(
        `${settings.provider} ${providerId} (machine ${machineId}): live work ${processes.join(', ')}; stop the shepherd working on it or wait for the work to end, then try again`,
      );
    }
    for (const providerId of report.unknown) {
      refusals.push(`${settings.provider} ${providerId}: not in the BMDB under provider ${settings.provider}`);
    }
    if (refusals.length > 0) {
      throw new DecommissionRefusedError(`refused ${refusals.length} machine(s):\n  ${refusals.join('\n  ')}`);
    }
  } finally {
    await bmdb.close();
  }
}

interface DecommissionSettings {
  readonly provider: string;
  readonly providerIds: readonly string[];
}

function decommissionSettings(argv: Argv): DecommissionSettings {
  const provider = required(argv, 'provider', 'decommission');
  const providerIds = listFlag(argv, 'provider-id');
  if (providerIds.length === 0) {
    throw new UsageError('provider-id', 'required for decommission: the provider IDs of the machines to remove');
  }
  return { provider, providerIds };
}
