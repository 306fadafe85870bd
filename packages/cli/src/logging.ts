import createDebug from 'debug';

/**
 * Logs are on by default in the CLI: every shepherd and BMDB event, one line
 * each, on stderr. `DEBUG` narrows or widens them (`DEBUG=shepherd:*`,
 * `DEBUG=*`); `DEBUG=` (empty) turns them off.
 */
export const DEFAULT_LOG_NAMESPACES = 'shepherd:*,bmdb:*,-bmdb:embedded';

export function enableLogs(): void {
  createDebug.enable(process.env.DEBUG ?? DEFAULT_LOG_NAMESPACES);
}

/** The CLI's own lines (start, stop, what it serves). */
export const log = createDebug('shepherd:cli');
