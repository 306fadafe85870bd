import createDebug from 'debug';

/** Loggers under `shepherd:static:*`; enable with `DEBUG=shepherd:static*`. */
export const log = {
  inventory: createDebug('shepherd:static:inventory'),
  provider: createDebug('shepherd:static:provider'),
  redfish: createDebug('shepherd:static:redfish'),
  ipmi: createDebug('shepherd:static:ipmi'),
  fake: createDebug('shepherd:static:fake-redfish'),
};
