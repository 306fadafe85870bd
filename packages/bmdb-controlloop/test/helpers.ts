import { randomUUID } from 'node:crypto';
import type { Database } from '@bmaas/bmdb-controlloop';
import { addProvided, machinesForAgentStart, newMachine } from '@bmaas/bmdb-controlloop';
import type { Kysely } from 'kysely';
import type { Session } from '../src/index.js';

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

/** A resolvable promise, for ordering concurrent steps in tests. */
export function deferred<T = void>(): { promise: Promise<T>; resolve(value: T): void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}
