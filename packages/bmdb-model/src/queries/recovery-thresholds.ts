/** When a started agent counts as lost: the thresholds and their SQL predicate. */
import { type RawBuilder, sql } from 'kysely';

/** Thresholds after which a started agent counts as lost. Milliseconds. */
export interface RecoveryThresholds {
  /** No first heartbeat this long after the agent started. Default 30 min. */
  readonly firstHeartbeatWithin?: number;
  /** Last heartbeat older than this. Default 10 min. */
  readonly heartbeatWithin?: number;
  /**
   * For a machine installing (its OS installation request delivered, not yet
   * reported): last sign of life (heartbeat or delivery) older than this.
   * Default 60 min. Its agent heartbeats while it writes the disk; this
   * keeps a reset from cutting the installation short when heartbeats are
   * late (a server restart, a saturated link), and still recovers a machine
   * whose agent died installing.
   */
  readonly installingHeartbeatWithin?: number;
}

const MINUTE = 60_000;
const DEFAULT_FIRST_HEARTBEAT_WITHIN = 30 * MINUTE;
const DEFAULT_HEARTBEAT_WITHIN = 10 * MINUTE;
const DEFAULT_INSTALLING_HEARTBEAT_WITHIN = 60 * MINUTE;

/** The thresholds in seconds, defaults filled in, for `make_interval(secs => …)`. */
export function thresholdSeconds(thresholds: RecoveryThresholds): {
  firstWithin: number;
  within: number;
  installingWithin: number;
} {
  return {
    firstWithin: seconds(thresholds.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN),
    within: seconds(thresholds.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN),
    installingWithin: seconds(thresholds.installingHeartbeatWithin ?? DEFAULT_INSTALLING_HEARTBEAT_WITHIN),
  };
}

/**
 * Whether the machine at `machineId` is installing and showed life within
 * the installing threshold: its request `Delivered` (handed to its agent,
 * not reported), and its last heartbeat or the delivery more recent than
 * `installingWithin` seconds. A key probe of the request; the recovery
 * selection leaves such machines alone.
 */
export function installingRecently(machineId: string, installingWithin: number): RawBuilder<boolean> {
  return sql<boolean>`EXISTS (SELECT 1 FROM machine_os_installation_request iq
    LEFT JOIN machine_agent_heartbeat ih ON ih.machine_id = iq.machine_id
    WHERE iq.machine_id = ${sql.ref(machineId)} AND iq.installation_state = 'Delivered'
      AND greatest(iq.delivered_at, ih.agent_heartbeat_at) >= now() - make_interval(secs => ${installingWithin}))`;
}

/** The recovery predicate over aliases `a` (AgentStarted) and `h` (AgentHeartbeat). */
export function lostAgent(thresholds: RecoveryThresholds): RawBuilder<boolean> {
  const { firstWithin, within } = thresholdSeconds(thresholds);
  return sql<boolean>`(
    (h.machine_id IS NULL AND a.agent_started_at < now() - make_interval(secs => ${firstWithin}))
    OR (h.machine_id IS NOT NULL AND h.agent_heartbeat_at < now() - make_interval(secs => ${within})))`;
}

function seconds(ms: number): number {
  if (!(ms >= 0) || !Number.isFinite(ms))
    throw new RangeError(`recovery threshold must be a duration >= 0, got ${ms}ms`);
  return ms / 1000;
}
