import createDebug from 'debug';

/** Loggers under the `bmdb:*` debug namespace; enable with `DEBUG=bmdb:*`. */
export const log = {
  connection: createDebug('bmdb:connection'),
  embedded: createDebug('bmdb:embedded'),
  migrate: createDebug('bmdb:migrate'),
  session: createDebug('bmdb:session'),
  /** Heartbeats retried while the deadline is not yet at risk: detail. */
  heartbeat: createDebug('bmdb:session:heartbeat'),
  work: createDebug('bmdb:work'),
  loop: createDebug('bmdb:loop'),
};

/**
 * Routine steps (claims, sessions started and closed, workers starting,
 * retried transactions), one level below the loggers above: `bmdb:*`
 * includes them, the shepherd's default logs leave them out (`-*:detail`).
 */
export const detail = {
  connection: createDebug('bmdb:connection:detail'),
  session: createDebug('bmdb:session:detail'),
  work: createDebug('bmdb:work:detail'),
  loop: createDebug('bmdb:loop:detail'),
};
