import { randomUUID } from 'node:crypto';
import type { Database, Session } from '@bmaas/bmdb-controlloop';
import { addProvided, machinesForAgentStart, newMachine } from '@bmaas/bmdb-model';
import type { Kysely } from 'kysely';

/** Creates `count` machines provided by `provider`; returns their machine IDs. */
export async function provideMachines(session: Session, count: number, provider = 'Test'): Promise<string[]> {
  return session.transact(async (q) => {
    const ids: string[] = [];
    for (let i = 0; i < count; i++) {
      const machineId = await newMachine(q);
      await addProvided(q, machineId, { provider, providerId: `${provider.toLowerCase()}-${randomUUID()}` });
      ids.push(machineId);
    }
    return ids;
  });
}

/** A retriever over agent-start candidates of provider `Test`. */
export const agentStartCandidates = (q: Kysely<Database>) => machinesForAgentStart(q, { provider: 'Test', limit: 1 });
