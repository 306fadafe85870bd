/** Node's network errors on a connection that could not be made or was cut. */
const NETWORK_ERRORS = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);
/** SQLSTATEs of a server going away: shutdown, crash, starting up, too many connections. */
const SERVER_GONE = new Set(['57P01', '57P02', '57P03', '53300']);

/**
 * Whether `error` says the database could not be reached or the connection
 * was lost — nothing about the statement itself. A statement that failed so
 * may or may not have committed; trying again once the database is back may
 * well work.
 */
export function isConnectionLost(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // Class 08: connection exception.
    return NETWORK_ERRORS.has(code) || SERVER_GONE.has(code) || code.startsWith('08');
  }
  // node-postgres reports a cut connection without a code.
  return /^Connection terminated|connection error and is not queryable|timeout exceeded when trying to connect/.test(
    error.message,
  );
}
