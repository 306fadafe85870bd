import type pg from 'pg';

/** The provider every benchmark machine belongs to. */
export const PROVIDER = 'Bench';

/**
 * Fills a migrated BMDB with `total` provided machines of {@link PROVIDER}, in
 * bulk SQL. All but `ready` have a started, heartbeating agent (ineligible for
 * both the initializer and the recoverer); `lost` of those heartbeated 20
 * minutes ago, so the recoverer has a few candidates. A fifth of the started
 * ones are installed instead (their OS installation succeeded, their agent
 * tags gone: in neither selection's indexes), and 1% are installing (a
 * delivered request, heartbeating). `held` (default 1%) are held by an
 * operator: a run that must claim every ready machine holds none, as a held
 * machine is never claimed. Power states were read a while ago for all but
 * 1%: On, and 0.5% Off, 0.2% whose last read failed.
 */
export async function fillFleet(
  client: pg.Client,
  fleet: { total: number; ready: number; lost?: number; held?: number },
): Promise<void> {
  const { total, ready, lost = 0, held = Math.round(total / 100) } = fleet;
  await client.query(
    `WITH m AS (
       INSERT INTO machines (machine_created_at)
       SELECT now() - interval '2 hours' FROM generate_series(1, $1::int) RETURNING machine_id)
     INSERT INTO machine_provided (machine_id, provider, provider_id, provider_status)
     SELECT machine_id, $2, 'bench-' || row_number() OVER (), 'Running' FROM m`,
    [total, PROVIDER],
  );
  const started = total - ready;
  if (started > 0) {
    await startAgents(client, started, lost);
    await installSome(client, Math.round(started / 5), Math.round(started / 100));
  }
  await client.query(
    `INSERT INTO machine_hold (machine_id, hold_reason, hold_actor, held_at)
     SELECT machine_id, 'bench maintenance', 'bench@host', now() - interval '1 hour'
     FROM machine_provided ORDER BY random() LIMIT $1::int`,
    [held],
  );
  // The power sync's rows exist (a trigger made them); all but 1% read a while ago.
  await client.query(
    `UPDATE machine_power_state ps SET
       power_state = CASE WHEN r.n % 200 = 0 THEN 'Off' ELSE 'On' END,
       power_state_read_at = now() - interval '30 seconds', power_checked_at = now() - interval '30 seconds',
       power_read_failed_at = CASE WHEN r.n % 500 = 1 THEN now() - interval '30 seconds' END,
       power_read_failed_cause = CASE WHEN r.n % 500 = 1 THEN 'BMC unreachable' END
     FROM (SELECT machine_id, row_number() OVER (ORDER BY random()) AS n FROM machine_power_state) r
     WHERE ps.machine_id = r.machine_id AND r.n % 100 <> 7`,
  );
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

/** Makes `installed` heartbeating machines installed (no agent tags) and `installing` others installing. */
async function installSome(client: pg.Client, installed: number, installing: number): Promise<void> {
  await client.query(
    `WITH chosen AS (
       SELECT h.machine_id, row_number() OVER () AS n FROM machine_agent_heartbeat h
       WHERE h.agent_heartbeat_at > now() - interval '1 minute' ORDER BY random() LIMIT $1::int + $2::int),
     requested AS (
       INSERT INTO machine_os_installation_request (machine_id, generation, image_url, image_sha256, root_device,
         compression, requested_by, installation_state, delivered_at, installation_ended_at)
       SELECT machine_id, 1, 'https://images.example.com/bench.img', repeat('ab', 32), '/dev/sda', 'none', 'bench',
         CASE WHEN n <= $1::int THEN 'Succeeded' ELSE 'Delivered' END, now() - interval '1 hour',
         CASE WHEN n <= $1::int THEN now() - interval '50 minutes' END
       FROM chosen RETURNING machine_id, installation_state),
     heartbeats AS (
       DELETE FROM machine_agent_heartbeat WHERE machine_id IN
         (SELECT machine_id FROM requested WHERE installation_state = 'Succeeded'))
     DELETE FROM machine_agent_started WHERE machine_id IN
       (SELECT machine_id FROM requested WHERE installation_state = 'Succeeded')`,
    [installed, installing],
  );
}
