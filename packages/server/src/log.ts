import createDebug from 'debug';

/** Loggers under the `bmaas:server` debug namespace; enable with `DEBUG=bmaas:*`. */
export const log = {
  server: createDebug('bmaas:server'),
  /** One line per refused heartbeat; recorded ones are counted, not logged. */
  heartbeat: createDebug('bmaas:server:heartbeat'),
  /** One line per enrollment, enrolled or refused: the machine and why, never the token. */
  enrollment: createDebug('bmaas:server:enrollment'),
  /** One line per installed OS's first boot report, recorded or refused: the machine, never its secret. */
  firstBoot: createDebug('bmaas:server:first-boot'),
};
