import type pg from 'pg';

/** The provider every benchmark machine belongs to. */
export const PROVIDER = 'Bench';

/**
 * Fills a migrated BMDB with `total` provided machines of {@link PROVIDER}, in
 * bulk SQL. All but `ready` have a started, heartbeating agent (ineligible for
 * both the initializer and the recoverer); `lost` of those heartbeated 20
 * minutes ago, so the recoverer has a few candidates.
 */
export async function fillFleet(
  client: pg.Client,
  fleet: { total: number; ready: number; lost?: number },
): Promise<void> {
  const { total, ready, lost = 0 } = fleet;
  await client.query(
    `WITH m AS (
       INSERT INTO machines (machine_created_at)
       SELECT now() - interval '2 hours' FROM generate_series(1, $1::int) RETURNING machine_id)
     INSERT INTO machine_provided (machine_id, provider, provider_id, provider_status)
     SELECT machine_id, $2, 'bench-' || row_number() OVER (), 'Running' FROM m`,
    [total, PROVIDER],
  );
  const started = total - ready;
  if (started > 0) await startAgents(client, started, lost);
  await client.query('VACUUM ANALYZE');
}

async function startAgents(client: pg.Client, started: number, lost: number): Promise<void> {
  await client.query(
    `WITH s AS (
       INSERT INTO machine_agent_started (machine_id, agent_started_at, agent_public_key)
       SELECT machine_id, now() - interval '1 hour', '\\x00'::bytea FROM machine_provided
       ORDER BY random() LIMIT $1::int RETURNING machine_id)
     INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
     SELECT machine_id, now() - CASE WHEN row_number() OVER () <= $2::int
       THEN interval '20 minutes' ELSE interval '30 seconds' END FROM s`,
    [started, lost],
  );
}
