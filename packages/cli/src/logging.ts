import createDebug from 'debug';

/**
 * Logs are on by default in the CLI: every shepherd and BMDB event, one line
 * each, on stderr. `DEBUG` narrows or widens them (`DEBUG=shepherd:*`,
 * `DEBUG=*`); `DEBUG=` (empty) turns them off.
 */
export const DEFAULT_LOG_NAMESPACES = 'shepherd:*,bmdb:*,-bmdb:embedded';

/**
 * Turns on the namespaces of `setting` (the process's `DEBUG`, read before
 * the `debug` package loaded: see `MainOptions.debug`), the default when unset.
 */
export function enableLogs(setting: string | undefined): void {
  createDebug.enable(setting ?? DEFAULT_LOG_NAMESPACES);
}

/** The CLI's own lines (start, stop, what it serves). */
export const log = createDebug('shepherd:cli');
