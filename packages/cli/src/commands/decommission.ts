import { setTimeout as sleep } from 'node:timers/promises';
import type { BMDB } from '@bmaas/bmdb-controlloop';
import type { DecommissionReport, WipeDecommissionReport } from '@bmaas/bmdb-model';
import { decommissionMachines, decommissionWithWipe } from '@bmaas/bmdb-model';
import { openBMDB } from '../database.js';
import { log } from '../logging.js';
import { type Argv, actor, databaseSettings, duration, optional, reason, required, UsageError } from '../settings.js';
import { listFlag } from './machine-targets.js';

/** The machines `shepherd decommission` removed and refused. */
export class DecommissionRefusedError extends Error {
  override name = 'DecommissionRefusedError';
}

/**
 * `shepherd decommission --provider P --provider-id ID… [--reason TEXT]`:
 * removes machines from the BMDB (their tags and backoffs; their work
 * history stays) and retires them, with the actor and reason: the
 * provisioner does not bring a retired machine back while its provider still
 * lists it (`shepherd recommission` does). Machines with live work are
 * refused and left alone; so are IDs the BMDB does not know. Exits 1 if any
 * was refused, after removing the others.
 */
export async function decommission(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings = decommissionSettings(argv);
  if (argv.wipe === true) {
    const wipe = {
      reason: reason(argv, 'decommission --wipe'),
      actor: actor(argv),
      timeoutMs: duration(argv, 'wipe-timeout'),
    };
    const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, attach: true });
    try {
      await decommissionWiping(bmdb, settings, wipe, write);
    } finally {
      await bmdb.close();
    }
    return;
  }
  const request = { actor: actor(argv), reason: optional(argv, 'reason')?.trim() || undefined };
  const bmdb = await openBMDB(databaseSettings(argv), { migrate: false, attach: true });
  try {
    const session = await bmdb.startSession({ processor: 'shepherd-decommission' });
    let report: DecommissionReport;
    try {
      report = await session.transact((q) => decommissionMachines(q, settings.provider, settings.providerIds, request));
    } finally {
      await session.close();
    }
    for (const { providerId, machineId } of report.removed) {
      log(
        'decommissioned machine %s (provider %s, provider ID %s) for %s; retired',
        machineId,
        settings.provider,
        providerId,
        request.actor,
      );
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

/** How often `decommission --wipe` looks whether the agents reported. */
const WIPE_POLL_MS = 1000;

/**
 * `shepherd decommission --wipe`: requests a wipe of each machine's disks
 * (one with a running agent, or one whose BMC boots its agent: the agent
 * booter boots one to wipe it; one whose agent arrives over SSH and runs no
 * more is refused: nothing can wipe it), waits up to `--wipe-timeout` for
 * the agents' reports, and removes and retires each machine whose wipe
 * succeeded. A failed wipe keeps its machine, with
 * the agent's error; so does one not reported in time, which the same
 * command run again removes once reported (it requests no second wipe).
 * Exits 1 if any machine is left.
 */
async function decommissionWiping(
  bmdb: BMDB,
  settings: DecommissionSettings,
  wipe: { readonly reason: string; readonly actor: string; readonly timeoutMs: number },
  write: (text: string) => void,
): Promise<void> {
  const { provider, providerIds } = settings;
  const deadline = Date.now() + wipe.timeoutMs;
  const session = await bmdb.startSession({ processor: 'shepherd-decommission' });
  let report: WipeDecommissionReport;
  const refusals: string[] = [];
  try {
    let first = true;
    let wanted = providerIds;
    for (;;) {
      const retryFailed = first;
      report = await session.transact((q) =>
        decommissionWithWipe(q, provider, wanted, { reason: wipe.reason, actor: wipe.actor, retryFailed }),
      );
      first = false;
      for (const { providerId, machineId } of report.removed) {
        log(
          'decommissioned machine %s (provider %s, provider ID %s) after wiping its disks; retired',
          machineId,
          provider,
          providerId,
        );
        write(`wiped and removed ${provider} ${providerId} (machine ${machineId})\n`);
      }
      for (const { providerId, machineId, generation, requestedNow } of report.wiping) {
        if (requestedNow)
          write(`wipe requested for ${provider} ${providerId} (machine ${machineId}), generation ${generation}\n`);
      }
      for (const { providerId, machineId, generation, error } of report.failed) {
        refusals.push(
          `${provider} ${providerId} (machine ${machineId}): its wipe (generation ${generation}) failed: ${error}; kept in the BMDB`,
        );
      }
      for (const { providerId, machineId } of report.noAgent) {
        refusals.push(
          `${provider} ${providerId} (machine ${machineId}): no agent runs on it, so its disks cannot be wiped yet: its agent arrives over SSH (boot method ssh), which only the initializer's takeover of a running OS starts, and its BMC boots none; kept in the BMDB`,
        );
      }
      for (const { providerId, machineId, processes } of report.busy) {
        refusals.push(
          `${provider} ${providerId} (machine ${machineId}): wiped, but live work ${processes.join(', ')}; run again once it ended`,
        );
      }
      for (const providerId of report.unknown) {
        if (retryFailed) refusals.push(`${provider} ${providerId}: not in the BMDB under provider ${provider}`);
      }
      // Only the machines still wiping are asked about again.
      wanted = report.wiping.map((w) => w.providerId);
      if (wanted.length === 0 || Date.now() >= deadline) break;
      await sleep(WIPE_POLL_MS);
    }
  } finally {
    await session.close();
  }
  for (const { providerId, machineId, generation } of report.wiping) {
    refusals.push(
      `${provider} ${providerId} (machine ${machineId}): its wipe (generation ${generation}) is not reported yet after ${wipe.timeoutMs / 1000} s; run the same command again to remove it once wiped`,
    );
  }
  if (refusals.length > 0) {
    throw new DecommissionRefusedError(`refused ${refusals.length} machine(s):\n  ${refusals.join('\n  ')}`);
  }
}
