/** Machines' boot methods: how each one's agent arrives, as the provider's inventory says. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { type Kysely, sql } from 'kysely';
import type { AgentBootMethod, Database } from '../schema.js';

const BOOT_METHODS: readonly string[] = ['ssh', 'virtual-media', 'network'];

/**
 * Sets the boot methods of `provider`'s machines, named by provider ID, in
 * one statement: a machine whose method changed gets it (`ssh` removes its
 * row of `machine_agent_boot`), and nothing else is written, so a round in
 * which nothing changed writes nothing. Machines of the provider not in
 * `methods`, and provider IDs the BMDB does not know, are left alone. A
 * pending machine switched between `ssh` and a BMC boot moves from the
 * initializer's selection to {@link agentBootSelection}'s, or back.
 *
 * @returns how many machines' methods changed
 * @throws {@link BMDBError} naming the provider ID of a method that is none of `ssh`, `virtual-media`, `network`
 */
export async function setAgentBootMethods(
  db: Kysely<Database>,
  provider: string,
  methods: ReadonlyMap<string, AgentBootMethod>,
): Promise<number> {
  const providerIds: string[] = [];
  const bootMethods: string[] = [];
  for (const [providerId, method] of methods) {
    if (!BOOT_METHODS.includes(method)) {
      throw new BMDBError(
        `machine ${providerId} of provider ${provider}: boot method ${JSON.stringify(method)} is none of ${BOOT_METHODS.join(', ')}`,
      );
    }
    providerIds.push(providerId);
    bootMethods.push(method);
  }
  if (providerIds.length === 0) return 0;
  // `changed` reads machine_agent_boot once: only rows whose method differs
  // reach the insert and the delete, so unchanged machines are not even locked.
  const { rows } = await sql<{ changed: number }>`
    WITH wanted AS (
      SELECT mp.machine_id, m.boot_method
      FROM unnest(${providerIds}::text[], ${bootMethods}::text[]) AS m (provider_id, boot_method)
      JOIN machine_provided mp ON mp.provider = ${provider} AND mp.provider_id = m.provider_id
    ), changed AS (
      SELECT w.machine_id, w.boot_method FROM wanted w
      LEFT JOIN machine_agent_boot ab ON ab.machine_id = w.machine_id
      WHERE coalesce(ab.boot_method, 'ssh') <> w.boot_method
    ), upserted AS (
      INSERT INTO machine_agent_boot (machine_id, boot_method)
      SELECT machine_id, boot_method FROM changed WHERE boot_method <> 'ssh'
      ON CONFLICT (machine_id) DO UPDATE SET boot_method = excluded.boot_method
      RETURNING machine_id
    ), deleted AS (
      DELETE FROM machine_agent_boot ab USING changed c
      WHERE ab.machine_id = c.machine_id AND c.boot_method = 'ssh'
      RETURNING ab.machine_id
    )
    SELECT ((SELECT count(*) FROM upserted) + (SELECT count(*) FROM deleted))::int AS changed`.execute(db);
  return rows[0]?.changed ?? 0;
}

/** How the machine's agent arrives: `ssh` unless its BMC boots it. A primary-key probe. */
export async function agentBootMethod(db: Kysely<Database>, machineId: string): Promise<AgentBootMethod> {
  const row = await db
    .selectFrom('machine_agent_boot')
    .select('boot_method')
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return row?.boot_method ?? 'ssh';
}

/** Machines whose BMC boots their agent, per method; every other machine is taken over through SSH. */
export type AgentBootCounts = Readonly<Record<Exclude<AgentBootMethod, 'ssh'>, number>>;

/** {@link AgentBootCounts}: a count of `machine_agent_boot`'s rows, which SSH machines have none of. */
export async function agentBootCounts(db: Kysely<Database>): Promise<AgentBootCounts> {
  const rows = await db
    .selectFrom('machine_agent_boot')
    .select(['boot_method', sql<number>`count(*)::int`.as('n')])
    .groupBy('boot_method')
    .execute();
  const counts = { 'virtual-media': 0, network: 0 };
  for (const row of rows) counts[row.boot_method] = row.n;
  return counts;
}
