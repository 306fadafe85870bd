import type { BMDB } from '@bmaas/bmdb-controlloop';
import { machinesPerProvider } from '@bmaas/bmdb-model';
import { log } from '../logging.js';

/**
 * Says at start how many machines of this shepherd's provider the BMDB holds,
 * and which other providers' machines it leaves alone: a machine recorded
 * under a provider no shepherd runs waits forever, and this is where an
 * operator sees it.
 */
export async function logProviders(bmdb: BMDB, type: string): Promise<void> {
  const counts = await machinesPerProvider(bmdb.db);
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
