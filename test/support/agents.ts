import type { TestDatabase } from './database.js';

/** A provided machine's started agent as the BMDB has it, its ages by the database's clock. */
export interface StartedAgent {
  readonly machineId: string;
  readonly providerId: string;
  /** The agent's public key, hex. */
  readonly key: string;
  /** Seconds since the agent was started. */
  readonly startedAgo: number;
  /** Seconds since its last heartbeat; null before the first. */
  readonly heartbeatAgo: number | null;
}

/** Every provided machine's started agent, by machine ID or by provider ID. */
export async function startedAgents(
  db: TestDatabase,
  by: 'machineId' | 'providerId',
): Promise<Map<string, StartedAgent>> {
  const { rows } = await db.admin(`
    SELECT p.machine_id, p.provider_id, encode(a.agent_public_key, 'hex') AS key,
           extract(epoch FROM now() - a.agent_started_at)::float8 AS started_ago,
           extract(epoch FROM now() - h.agent_heartbeat_at)::float8 AS heartbeat_ago
    FROM machine_provided p JOIN machine_agent_started a USING (machine_id)
    LEFT JOIN machine_agent_heartbeat h USING (machine_id)`);
  return new Map(
    rows.map((row) => {
      const agent: StartedAgent = {
        machineId: row.machine_id,
        providerId: row.provider_id,
        key: row.key,
        startedAgo: row.started_ago,
        heartbeatAgo: row.heartbeat_ago,
      };
      return [agent[by], agent];
    }),
  );
}
