import type { IncomingMessage } from 'node:http';
import { get as httpGet } from 'node:http';
import { get as httpsGet } from 'node:https';
import { rootCertificates } from 'node:tls';
import { InstallationError } from './errors.js';

/** How long a server may keep the agent waiting for its answer's headers, or between two reads. */
const IDLE_TIMEOUT_MS = 60_000;

/**
 * The body of a GET of `url` answered with status 200. An https URL is
 * verified against the system's CAs plus `ca` (PEM), when given.
 *
 * @throws {@link InstallationError} (`download`) for another scheme, status,
 *   or a failure to connect
 */
export function download(url: string, ca: string | undefined, signal: AbortSignal): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      return reject(new InstallationError('download', `image URL ${JSON.stringify(url)} is not a URL`));
    }
    const get = parsed.protocol === 'https:' ? httpsGet : parsed.protocol === 'http:' ? httpGet : undefined;
    if (!get) return reject(new InstallationError('download', `image URL ${url}: not http or https`));
    const options = { signal, ...(parsed.protocol === 'https:' && ca && { ca: [...rootCertificates, ca] }) };
    const request = get(url, options, (response) => {
      if (response.statusCode !== 200) {
        response.resume();
        return reject(new InstallationError('download', `HTTP status ${response.statusCode} for ${url}`));
      }
      resolve(response);
    });
    request.setTimeout(IDLE_TIMEOUT_MS, () =>
      request.destroy(new Error(`no data from ${url} within ${IDLE_TIMEOUT_MS / 1000} s`)),
    );
    request.on('error', (error) =>
      reject(new InstallationError('download', `download of ${url} failed: ${error.message}`, { cause: error })),
    );
  });
}
