import createDebug from 'debug';

/** Loggers under `shepherd:equinix:*`; enable with `DEBUG=shepherd:equinix*`. */
export const log = {
  api: createDebug('shepherd:equinix:api'),
  provider: createDebug('shepherd:equinix:provider'),
  status: createDebug('shepherd:equinix:status'),
  fake: createDebug('shepherd:equinix:fake'),
};

/**
 * Steps within the shepherd's events (a device created and recorded, which
 * the provisioner reports as one line): `shepherd:*` includes them, the CLI's
 * default logs not.
 */
export const detail = {
  api: createDebug('shepherd:equinix:api:detail'),
  provider: createDebug('shepherd:equinix:provider:detail'),
};
