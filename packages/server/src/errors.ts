/** Base class of the errors @bmaas/server throws on purpose. */
export class BmaasServerError extends Error {
  override name = 'BmaasServerError';
}

/** The server's TLS certificate or key could not be read, made or used; names the file. */
export class ServerTlsError extends BmaasServerError {
  override name = 'ServerTlsError';
  constructor(
    readonly file: string,
    problem: string,
    options?: ErrorOptions,
  ) {
    super(`server TLS: ${file}: ${problem}`, options);
  }
}

/** The server could not listen where it was told to. */
export class ListenError extends BmaasServerError {
  override name = 'ListenError';
  constructor(
    readonly host: string,
    readonly port: number,
    reason: string,
    options?: ErrorOptions,
  ) {
    super(`cannot listen on ${host}:${port} (${reason})`, options);
  }
}
