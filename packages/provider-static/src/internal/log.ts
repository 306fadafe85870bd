import createDebug from 'debug';

/** Loggers under `shepherd:static:*`; enable with `DEBUG=shepherd:static*`. */
export const log = {
  inventory: createDebug('shepherd:static:inventory'),
  provider: createDebug('shepherd:static:provider'),
  redfish: createDebug('shepherd:static:redfish'),
  fake: createDebug('shepherd:static:fake-redfish'),
};

/** The message of an unknown thrown value, with the cause a fetch failure hides behind. */
export function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const code = (error as { code?: unknown }).code;
  let message =
    typeof code === 'string' && !error.message.includes(code) ? `${error.message} (${code})` : error.message;
  if (error.cause !== undefined && error.message === 'fetch failed') message += `: ${describeError(error.cause)}`;
  return message;
}

/** A URL with any user info masked, for messages. */
export function redactUrl(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/@]*@/i, '$1***@');
}
