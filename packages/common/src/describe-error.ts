/**
 * The message of an unknown thrown value, for logs and failure causes: with
 * its error code when the message lacks it, and with the cause that fetch
 * (undici) hides behind its bare "fetch failed".
 */
export function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const code = (error as { code?: unknown }).code;
  let message =
    typeof code === 'string' && !error.message.includes(code) ? `${error.message} (${code})` : error.message;
  if (error.cause !== undefined && error.message === 'fetch failed') message += `: ${describeError(error.cause)}`;
  return message;
}
