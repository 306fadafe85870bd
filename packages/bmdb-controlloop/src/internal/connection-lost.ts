/**
 * What a failover of the BMDB (a Patroni cluster behind HAProxy, say) or an
 * outage does to a statement, as the metrics label it
 * (`bmdb_connection_lost_total{cause}`):
 *
 * - `connection_lost`: the connection could not be made or was cut (the
 *   primary crashed, HAProxy shut the sessions of a node it marked down);
 * - `admin_shutdown`: the server is shutting down or crashed (57P01, 57P02);
 * - `starting_up`: the server is starting or recovering (57P03);
 * - `read_only`: the node is a standby, or was demoted (25006): the
 *   connection reached a node that is no longer the primary;
 * - `too_many_connections`: 53300, as a new primary fills up with reconnects.
 */
export type ConnectionLoss =
  | 'connection_lost'
  | 'admin_shutdown'
  | 'starting_up'
  | 'read_only'
  | 'too_many_connections';

/** Node's network errors on a connection that could not be made or was cut. */
const NETWORK_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);
/** SQLSTATEs of a server going away or not yet there, and of a node that is not the primary. */
const SQLSTATES: ReadonlyMap<string, ConnectionLoss> = new Map([
  ['57P01', 'admin_shutdown'],
  ['57P02', 'admin_shutdown'],
  ['57P03', 'starting_up'],
  ['25006', 'read_only'],
  ['53300', 'too_many_connections'],
]);

/**
 * Why `error` says the database could not be reached, the connection was
 * lost, or it reached a node that cannot write: nothing about the statement
 * itself. Undefined for any other error.
 */
export function connectionLoss(error: unknown): ConnectionLoss | undefined {
  if (!(error instanceof Error)) return undefined;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // Class 08: connection exception.
    if (NETWORK_ERRORS.has(code) || code.startsWith('08')) return 'connection_lost';
    return SQLSTATES.get(code);
  }
  // node-postgres reports a cut connection without a code.
  return /^Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/.test(
    error.message,
  )
    ? 'connection_lost'
    : undefined;
}

/**
 * Whether `error` is a {@link connectionLoss}. A statement that failed so
 * may or may not have committed (a read-only node's refusal did not, but is
 * treated alike); trying again on a fresh connection once a primary answers
 * may well work.
 */
export function isConnectionLost(error: unknown): boolean {
  return connectionLoss(error) !== undefined;
}

/**
 * Losses after which the statement certainly did not run, so the whole
 * transaction can simply be sent again: a node that refused to write, or
 * one that refused the connection while starting.
 */
export function isNotExecuted(loss: ConnectionLoss | undefined): boolean {
  return loss === 'read_only' || loss === 'starting_up';
}

/** The loss in words an operator reads in a log line as a failover (or an outage) under way. */
export function describeConnectionLoss(loss: ConnectionLoss): string {
  switch (loss) {
    case 'connection_lost':
      return 'BMDB failover or outage: the connection was lost';
    case 'admin_shutdown':
      return 'BMDB failover or outage: the server is shutting down';
    case 'starting_up':
      return 'BMDB failover or outage: the server is starting up';
    case 'read_only':
      return 'BMDB failover: the node is read-only (no longer the primary)';
    case 'too_many_connections':
      return 'BMDB failover or outage: the server has too many connections';
  }
}
