import { describeError } from '@bmaas/common';
import type { BMDBMetrics } from '../metrics.js';
import { connectionLoss, describeConnectionLoss } from './connection-lost.js';
import { log } from './log.js';

/** How often a failed heartbeat is retried, as a fraction of the interval. */
const HEARTBEAT_RETRY_FRACTION = 10;
/** A heartbeat failing with less than this fraction of the interval left puts the deadline at risk. */
const HEARTBEAT_AT_RISK_FRACTION = 4;

/** A failed heartbeat of a live session, `left` ms before its deadline. */
export interface HeartbeatFailure {
  readonly sessionId: string;
  readonly processor: string;
  /** The session's interval, in milliseconds. */
  readonly interval: number;
  readonly left: number;
  readonly error: unknown;
}

/**
 * Counts and logs a failed heartbeat, and returns how long to wait before
 * the next try: a tenth of the interval, never past the deadline.
 */
export function reportHeartbeatFailure(failure: HeartbeatFailure, metrics: BMDBMetrics | undefined): number {
  const { sessionId, processor, interval, left, error } = failure;
  const code = (error as { code?: unknown }).code;
  metrics?.heartbeatsFailed.inc({ processor, code: typeof code === 'string' ? code : 'none' });
  const loss = connectionLoss(error);
  if (loss) metrics?.connectionLost.inc({ processor, cause: loss });
  // Retries come every tenth of the interval; only a deadline close enough to miss is worth a person's notice.
  const atRisk = left < interval / HEARTBEAT_AT_RISK_FRACTION;
  (atRisk ? log.session : log.heartbeat)(
    '%ssession %s heartbeat failed, retrying (%dms to deadline): %s%s',
    atRisk ? 'warning: deadline at risk: ' : '',
    sessionId,
    Math.round(left),
    loss ? `${describeConnectionLoss(loss)}: ` : '',
    describeError(error),
  );
  return Math.min(left, interval / HEARTBEAT_RETRY_FRACTION);
}
