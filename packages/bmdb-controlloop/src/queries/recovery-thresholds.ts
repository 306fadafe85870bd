/** When a started agent counts as lost: the thresholds and their SQL predicate. */
import { type RawBuilder, sql } from 'kysely';

/** Thresholds after which a started agent counts as lost. Milliseconds. */
export interface RecoveryThresholds {
  /** No first heartbeat this long after the agent started. Default 30 min. */
  readonly firstHeartbeatWithin?: number;
  /** Last heartbeat older than this. Default 10 min. */
  readonly heartbeatWithin?: number;
}

const MINUTE = 60_000;
const DEFAULT_FIRST_HEARTBEAT_WITHIN = 30 * MINUTE;
const DEFAULT_HEARTBEAT_WITHIN = 10 * MINUTE;

/** The thresholds in seconds, defaults filled in, for `make_interval(secs => …)`. */
export function thresholdSeconds(thresholds: RecoveryThresholds): { firstWithin: number; within: number } {
  return {
    firstWithin: seconds(thresholds.firstHeartbeatWithin ?? DEFAULT_FIRST_HEARTBEAT_WITHIN),
    within: seconds(thresholds.heartbeatWithin ?? DEFAULT_HEARTBEAT_WITHIN),
  };
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
