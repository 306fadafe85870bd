import type { NetworkConfig } from '../first-boot.js';
import type { RootDeviceHints } from '../root-device-hints.js';
import type { OSImageCompression, OSRequestKind } from '../schema.js';

/**
 * The heartbeats of a batch, one array element per heartbeat. The statement
 * keeps those whose machine has an AgentStarted tag with the same public key
 * (`authenticated`), and for each sets AgentHeartbeat to now and stores the
 * hardware report sent (with its totals, for the fleet gauges) and the tail
 * of the agent's log sent (migration 0013); it returns
 * their positions, and the installation request each one's machine is to be
 * handed. A heartbeat with an unknown machine or another key writes nothing.
 *
 * The OS installation part (migrations 0009, 0010) costs a key probe per
 * heartbeat into `machine_os_installation_request`, and writes only when
 * something changes:
 * - `open`: the machine's request still waiting for its report (`Requested`
 *   or `Delivered`), with whether this heartbeat reports on its generation
 *   (`result`), and whether it may be handed out (`deliverable`): not while
 *   a recovery of the machine is under way (the reboot would cut the
 *   installation short); not while an operator holds the machine, unless it
 *   is `Delivered` already (a hold keeps new work from starting; answering
 *   without the request the agent is installing would tell it to stop, and
 *   zero its disk's start); and never to a heartbeat reporting `Success` of
 *   another generation (an older request finished while this one was
 *   requested): its agent may reboot into that image whatever the answer,
 *   and the request would then show `Delivered` on a machine that runs
 *   another image. It goes to the agent's next heartbeat.
 * - While an agent boot of the machine is under way (a `ShepherdAgentBoot`
 *   work row, live or not: a key probe of `work_machine_process_key`, only
 *   for machines with an open request), its agent's report is not stored
 *   (`ignored`) and no request is handed out: the booter is about to reset
 *   the machine into a new agent, and a `Succeeded` landing now would leave
 *   that agent refused on a machine no selection takes, and a request
 *   handed out now would be cut short by the reset. The new agent gets the
 *   request once the boot's work ended.
 * - A report of that generation is stored with the key that sent it, and
 *   the request marked `Succeeded` (with the sha256 of the first-boot
 *   secret the report carries, for `recordFirstBoot`) or `Failed` (with the agent's error); a
 *   report of any other generation is ignored. A request handed out for the
 *   first time is marked `Delivered`. The UPDATE re-checks the generation on
 *   the row's latest version, so a new request committed meanwhile is left
 *   as it is (and the report counts as ignored).
 * - On `Succeeded` the machine runs its OS, not the agent: its AgentStarted
 *   and AgentHeartbeat go (as after a recovery), and migration 0009's
 *   triggers keep it out of the machines pending an agent start; its
 *   heartbeat is not upserted, so no row is written twice by one statement.
 * - `repeated`: the same `Success` report sent again by the key that sent it
 *   (the agent never got the first answer), while the machine's request is
 *   still that generation, `Succeeded`. Its AgentStarted tag went with the
 *   first, so it is checked against the report's key instead; it writes
 *   nothing and is answered as the first was, so the agent goes on to
 *   reboot. The key stays good for it until the machine's next request,
 *   with no time bound: an agent cut off from the server for longer than any
 *   bound would never reboot, while the BMDB, counting the machine
 *   installed, looks at it no more. It cannot outlive the machine's agent:
 *   a machine is started an agent again only after a new request (0009's
 *   trigger), which ends it. Only heartbeats carrying a `Success` report
 *   probe the report and request rows for it.
 * - `stored`: the heartbeats whose report settled the request. Any report
 *   neither stored nor `repeated` was ignored, which the agent is told.
 * - `pending`: what the answer carries, every heartbeat until the report
 *   (the agent recognizes a generation it is already installing).
 *
 * The agent's log (migration 0013) is written only for the heartbeats that
 * carry one (an agent sends it when it changed): for the others it costs a
 * row of the `authenticated` scan filtered out, no index probe and no write
 * (EXPLAIN ANALYZE of a batch of 256 without logs: 0.1 ms in the
 * `agent_log` part, beside 4.4 ms setting the heartbeats, at load 5-7).
 *
 * `FOR KEY SHARE` holds the AgentStarted row until the statement ends, so a
 * recovery deleting it either committed first (the row is re-checked, gone,
 * and the heartbeat refused) or waits: a heartbeat never lands on a machine
 * whose agent was just written off.
 *
 * One statement at READ COMMITTED, every table reached through keys of the
 * batch, planned once (see sql/end-work.ts).
 */
export const HEARTBEAT_SQL = `
  WITH requests AS (
    SELECT * FROM unnest($1::uuid[], $2::bytea[], $3::bytea[], $4::bigint[], $5::text[], $6::bytea[], $7::text[],
                         $8::bigint[], $9::bigint[], $10::int[], $11::bigint[], $12::text[], $13::bytea[])
      WITH ORDINALITY AS r (machine_id, public_key, hardware_report, generation, result, installation_report,
                            installation_error, cpu_threads, memory_bytes, disks, disk_bytes, agent_log,
                            boot_secret_sha256, ord)),
  authenticated AS (
    SELECT r.* FROM requests r JOIN machine_agent_started a ON a.machine_id = r.machine_id
    WHERE a.machine_id = ANY ($1::uuid[]) AND a.agent_public_key = r.public_key
    FOR KEY SHARE OF a),
  repeated AS (
    SELECT r.ord FROM requests r
    JOIN machine_os_installation_report p ON p.machine_id = r.machine_id AND p.generation = r.generation
    JOIN machine_os_installation_request q ON q.machine_id = r.machine_id AND q.generation = r.generation
    WHERE r.result = 'Success' AND p.machine_id = ANY ($1::uuid[]) AND q.machine_id = ANY ($1::uuid[])
      AND p.os_installation_result = 'Success' AND p.agent_public_key = r.public_key
      AND q.installation_state = 'Succeeded' AND r.ord NOT IN (SELECT ord FROM authenticated)),
  open AS (
    SELECT a.ord, a.machine_id, a.public_key, a.installation_report, a.installation_error, a.boot_secret_sha256,
      q.generation, q.installation_state, q.request_kind, q.image_url, q.image_sha256, q.root_device,
      q.root_device_hints, q.compression, q.user_data, q.hostname, q.ssh_public_keys, q.network,
      CASE WHEN a.generation = q.generation AND NOT b.booting THEN a.result END AS result,
      -- Not held unless delivered, not under recovery: queries/conditions.ts's
      -- isHeld and hasLiveWork, written out in this statement's raw text.
      (q.installation_state = 'Delivered'
        OR NOT EXISTS (SELECT 1 FROM machine_hold hd WHERE hd.machine_id = a.machine_id))
        AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
          WHERE w.machine_id = a.machine_id AND w.process = 'ShepherdRecovery' AND s.deadline > now())
        AND a.result IS DISTINCT FROM 'Success'
        AND NOT b.booting
        AS deliverable
    FROM authenticated a JOIN machine_os_installation_request q ON q.machine_id = a.machine_id
      -- An agent boot of the machine: its work row, whoever's session (the booter may reset it still).
      CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM work w
        WHERE w.machine_id = a.machine_id AND w.process = 'ShepherdAgentBoot') AS booting) b
    WHERE q.installation_state IN ('Requested', 'Delivered')),
  installation AS (
    INSERT INTO machine_os_installation_report
      (machine_id, generation, os_installation_result, os_installation_report_raw, os_installation_reported_at,
       agent_public_key)
    SELECT machine_id, generation, result, installation_report, now(), public_key FROM open WHERE result IS NOT NULL
    ON CONFLICT (machine_id) DO UPDATE
    SET generation = excluded.generation, os_installation_result = excluded.os_installation_result,
        os_installation_report_raw = excluded.os_installation_report_raw,
        os_installation_reported_at = excluded.os_installation_reported_at,
        agent_public_key = excluded.agent_public_key),
  marked AS (
    UPDATE machine_os_installation_request q
    SET installation_state = CASE o.result WHEN 'Success' THEN 'Succeeded' WHEN 'Error' THEN 'Failed'
                                           ELSE 'Delivered' END,
        delivered_at = coalesce(q.delivered_at, now()),
        installation_ended_at = CASE WHEN o.result IS NOT NULL THEN now() END,
        installation_error = CASE WHEN o.result = 'Error'
          THEN coalesce(nullif(o.installation_error, ''), 'the agent reported an error without a message') END,
        boot_secret_sha256 = CASE WHEN o.result = 'Success' THEN o.boot_secret_sha256 END
    FROM open o
    WHERE q.machine_id = o.machine_id AND q.generation = o.generation
      AND q.installation_state IN ('Requested', 'Delivered')
      AND (o.result IS NOT NULL OR (q.installation_state = 'Requested' AND o.deliverable))
    RETURNING q.machine_id, q.installation_state),
  installed AS (SELECT machine_id FROM marked WHERE installation_state = 'Succeeded'),
  agent_gone AS (DELETE FROM machine_agent_started WHERE machine_id IN (SELECT machine_id FROM installed)),
  heartbeat_gone AS (DELETE FROM machine_agent_heartbeat WHERE machine_id IN (SELECT machine_id FROM installed)),
  heartbeats AS (
    INSERT INTO machine_agent_heartbeat (machine_id, agent_heartbeat_at)
    SELECT machine_id, now() FROM authenticated WHERE machine_id NOT IN (SELECT machine_id FROM installed)
    ON CONFLICT (machine_id) DO UPDATE SET agent_heartbeat_at = excluded.agent_heartbeat_at),
  hardware AS (
    INSERT INTO machine_hardware_report
      (machine_id, hardware_report_raw, hardware_reported_at, cpu_threads, memory_bytes, disks, disk_bytes)
    SELECT machine_id, hardware_report, now(), cpu_threads, memory_bytes, disks, disk_bytes
    FROM authenticated WHERE hardware_report IS NOT NULL
    ON CONFLICT (machine_id) DO UPDATE
    SET hardware_report_raw = excluded.hardware_report_raw, hardware_reported_at = excluded.hardware_reported_at,
        cpu_threads = excluded.cpu_threads, memory_bytes = excluded.memory_bytes, disks = excluded.disks,
        disk_bytes = excluded.disk_bytes),
  agent_log AS (
    INSERT INTO machine_agent_log (machine_id, agent_log, agent_log_received_at)
    SELECT machine_id, agent_log, now() FROM authenticated WHERE agent_log IS NOT NULL
    ON CONFLICT (machine_id) DO UPDATE
    SET agent_log = excluded.agent_log, agent_log_received_at = excluded.agent_log_received_at)
  SELECT coalesce(array_agg(ord::int), '{}') AS authenticated,
    (SELECT coalesce(array_agg(ord::int), '{}') FROM repeated) AS repeated,
    (SELECT coalesce(array_agg(o.ord::int), '{}') FROM open o JOIN marked m ON m.machine_id = o.machine_id
     WHERE o.result IS NOT NULL) AS stored,
    (SELECT json_agg(json_build_object('ord', o.ord, 'generation', o.generation::text, 'kind', o.request_kind,
        'imageUrl', o.image_url,
        'imageSha256', o.image_sha256, 'rootDevice', o.root_device,
        'rootDeviceHints', o.root_device_hints, 'compression', o.compression,
        'userData', encode(o.user_data, 'base64'), 'hostname', o.hostname, 'sshPublicKeys', o.ssh_public_keys,
        'network', o.network))
     FROM open o WHERE o.result IS NULL AND o.deliverable) AS pending
  FROM authenticated`;

/** A pending request as the statement returns it (JSON). */
export interface PendingRow {
  readonly ord: number;
  readonly generation: string;
  readonly kind: OSRequestKind;
  /** Null for a disk wipe (migration 0012). */
  readonly imageUrl: string | null;
  readonly imageSha256: string | null;
  readonly rootDevice: string | null;
  readonly rootDeviceHints: RootDeviceHints | null;
  readonly compression: OSImageCompression;
  readonly userData: string | null;
  /** Null for a disk wipe. */
  readonly hostname: string | null;
  readonly sshPublicKeys: string[];
  readonly network: NetworkConfig | null;
}
