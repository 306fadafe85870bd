import type { ClientRequest, IncomingMessage, RequestOptions } from 'node:http';
import { get as httpGet } from 'node:http';
import { get as httpsGet } from 'node:https';
import { rootCertificates } from 'node:tls';
import { InstallationError } from './errors.js';

/** How long a server may keep the agent waiting for its answer's headers, or between two reads, unless told. */
export const DEFAULT_IDLE_TIMEOUT_MS = 60_000;

/** The most redirects one download follows: curl's and browsers' bounds are larger, but images move once or twice. */
export const MAX_REDIRECTS = 5;

/** Statuses whose Location the agent follows. */
const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** What a download is fetched with. */
export interface DownloadOptions {
  /** PEM CA certificate trusted beside the system's for an https URL. */
  readonly ca?: string | undefined;
  readonly signal: AbortSignal;
  /** The longest the server may leave the agent waiting for headers or between two reads; 60 s unless given. */
  readonly idleTimeoutMs?: number | undefined;
  /** Only these bytes (a Range request, answered 206), `end` exclusive. */
  readonly range?: { readonly start: number; readonly end: number } | undefined;
}

/**
 * The body of a GET of `url` answered with status 200 (206 for a range),
 * following up to {@link MAX_REDIRECTS} redirects, each to an http or https
 * URL. An https URL is verified against the system's CAs plus `ca` (PEM),
 * when given. A server silent for the idle timeout, before its headers or
 * between two reads, ends the body with an {@link InstallationError}
 * (`stalled`).
 *
 * @throws {@link InstallationError} (`download`) for another scheme, status,
 *   too many redirects, or a failure to connect; each names the URL
 */
export async function download(url: string, options: DownloadOptions): Promise<IncomingMessage> {
  let current = url;
  for (let hops = 0; ; hops++) {
    const response = await get(current, url, options);
    const status = response.statusCode ?? 0;
    if (!REDIRECTS.has(status)) {
      const want = options.range ? 206 : 200;
      if (status === want) return response;
      response.resume();
      const where = current === url ? url : `${url} (redirected to ${current})`;
      if (options.range && status === 200) {
        throw new InstallationError(
          'download',
          `${where} answered a range request with the whole file (status 200): its server does not serve ranges`,
        );
      }
      throw new InstallationError('download', `HTTP status ${status} for ${where}`);
    }
    response.resume();
    const location = response.headers.location;
    if (location === undefined) {
      throw new InstallationError('download', `HTTP status ${status} for ${current} without a Location`);
    }
    if (hops === MAX_REDIRECTS) {
      throw new InstallationError('download', `${url}: more than ${MAX_REDIRECTS} redirects (the last to ${location})`);
    }
    let next: URL;
    try {
      next = new URL(location, current);
    } catch {
      throw new InstallationError('download', `${current} redirects to ${JSON.stringify(location)}, not a URL`);
    }
    if (next.protocol !== 'http:' && next.protocol !== 'https:') {
      throw new InstallationError('download', `${current} redirects to ${next.href}: not http or https`);
    }
    current = next.href;
  }
}

/** One GET, redirects not followed; the idle timeout armed for its whole body. */
function get(url: string, first: string, options: DownloadOptions): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      return reject(new InstallationError('download', `image URL ${JSON.stringify(url)} is not a URL`));
    }
    const getter = parsed.protocol === 'https:' ? httpsGet : parsed.protocol === 'http:' ? httpGet : undefined;
    if (!getter) return reject(new InstallationError('download', `image URL ${url}: not http or https`));
    const { ca, signal, range } = options;
    const idleMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    const requestOptions: RequestOptions & { ca?: string[] } = {
      signal,
      ...(range && { headers: { range: `bytes=${range.start}-${range.end - 1}` } }),
      ...(parsed.protocol === 'https:' && ca && { ca: [...rootCertificates, ca] }),
    };
    let response: IncomingMessage | undefined;
    const request: ClientRequest = getter(url, requestOptions, (answer) => {
      response = answer;
      resolve(answer);
    });
    request.setTimeout(idleMs, () => {
      const where = url === first ? url : `${first} (redirected to ${url})`;
      const stalled = new InstallationError(
        'stalled',
        `download of ${where} stalled: no data within ${idleMs / 1000} s${response ? '' : ' (no answer)'}`,
      );
      // Destroying the request alone would end a body under way with Node's own "aborted".
      if (response) response.destroy(stalled);
      request.destroy(stalled);
    });
    request.on('error', (error) => {
      if (error instanceof InstallationError) return reject(error);
      reject(new InstallationError('download', `download of ${url} failed: ${error.message}`, { cause: error }));
    });
  });
}
