import { randomBytes, randomUUID } from 'node:crypto';
import type { BMDB, Database, Session } from '@bmaas/bmdb-controlloop';
import {
  AgentHeartbeats,
  addProvided,
  bootSecretSha256,
  machinesForAgentStart,
  newMachine,
  requestOSInstallation,
  setAgentStarted,
} from '@bmaas/bmdb-model';
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

/** What {@link installedMachine}'s installation request says besides its fixed image. */
export interface InstalledMachineRequest {
  readonly actor: string;
  readonly reason: string;
  readonly sshPublicKeys?: readonly string[];
}

/**
 * A Static machine whose OS installation succeeded as its agent reports it
 * (requested, delivered in a heartbeat's answer, reported `Success` with the
 * first-boot secret's hash); returns the machine and that secret, which the
 * installed OS would report its first boot with.
 */
export async function installedMachine(
  bmdb: BMDB,
  providerId: string,
  request: InstalledMachineRequest,
): Promise<{ machineId: string; secret: string }> {
  const q = bmdb.db;
  const machineId = await newMachine(q);
  await addProvided(q, machineId, { provider: 'Static', providerId });
  const key = new Uint8Array(randomBytes(32));
  await setAgentStarted(q, machineId, { publicKey: key });
  await requestOSInstallation(q, machineId, {
    imageUrl: 'https://images.example.com/debian-12.img',
    imageSha256: 'ab'.repeat(32),
    rootDevice: '/dev/sda',
    ...request,
  });
  const heartbeats = AgentHeartbeats.of(bmdb);
  await heartbeats.answer({ machineId, publicKey: key });
  const secret = randomBytes(32).toString('base64url');
  await heartbeats.answer({
    machineId,
    publicKey: key,
    installationReport: {
      generation: 1n,
      result: 'Success',
      raw: new Uint8Array([8, 1]),
      bootSecretSha256: bootSecretSha256(secret),
    },
  });
  return { machineId, secret };
}
