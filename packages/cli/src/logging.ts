import createDebug from 'debug';

/**
 * Logs are on by default in the CLI: every shepherd and BMDB event a person
 * cares about (machine provided, agent started, failed with its cause and
 * backoff, rebooted), one line each, on stderr. The steps within them are
 * under `…:detail` namespaces, included by `DEBUG=shepherd:*,bmdb:*`. `DEBUG`
 * narrows or widens them (`DEBUG=shepherd:*`, `DEBUG=*`); `DEBUG=` (empty)
 * turns them off.
 */
export const DEFAULT_LOG_NAMESPACES = 'shepherd:*,bmdb:*,-*:detail,-bmdb:embedded';

/**
 * Turns on the namespaces of `setting` (the process's `DEBUG`, read before
 * the `debug` package loaded: see `MainOptions.debug`), the default when unset.
 */
export function enableLogs(setting: string | undefined): void {
  createDebug.enable(setting ?? DEFAULT_LOG_NAMESPACES);
}

/** The CLI's own lines (start, stop, what it serves). */
export const log = createDebug('shepherd:cli');
