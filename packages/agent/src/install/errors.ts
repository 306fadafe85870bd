/** What went wrong in an installation; see {@link InstallationError}. */
export type InstallationProblem =
  | 'device'
  | 'download'
  | 'stalled'
  | 'format'
  | 'too-large'
  | 'sha256-mismatch'
  | 'timeout'
  | 'stopped'
  | 'write'
  | 'boot-entry'
  | 'config-drive'
  | 'request'
  | 'in-place';

/** An installation failed; `problem` says at which step, the message names the device or URL. */
export class InstallationError extends Error {
  override name = 'InstallationError';
  constructor(
    readonly problem: InstallationProblem,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
