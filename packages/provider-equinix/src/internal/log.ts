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

/** The message of an unknown thrown value, with the cause a fetch failure hides behind. */
export function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const code = (error as { code?: unknown }).code;
  let message =
    typeof code === 'string' && !error.message.includes(code) ? `${error.message} (${code})` : error.message;
  // undici reports every network failure as "fetch failed"; the reason is in the cause.
  if (error.cause !== undefined && error.message === 'fetch failed') message += `: ${describeError(error.cause)}`;
  return message;
}
