import createDebug from 'debug';

/** Loggers under the `bmaas:server` debug namespace; enable with `DEBUG=bmaas:*`. */
export const log = {
  server: createDebug('bmaas:server'),
  /** One line per refused heartbeat; recorded ones are counted, not logged. */
  heartbeat: createDebug('bmaas:server:heartbeat'),
};
