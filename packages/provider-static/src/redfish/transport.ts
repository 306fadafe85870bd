import { describeError, retry } from '@bmaas/common';
import { PowerOutcomeUnknownError } from '@bmaas/shepherd-manager';
import { Agent, type Dispatcher, request } from 'undici';
import {
  BmcCredentialsError,
  BmcResponseError,
  BmcTimeoutError,
  BmcUnreachableError,
  RedfishHttpError,
} from '../errors.js';
import { log } from '../internal/log.js';
import type { RedfishClientSettings } from './client-settings.js';
import { isRecord } from './json.js';
import type { RedfishTarget } from './target.js';

/** The requests the client sends: reads, actions, and a PATCH of the boot override. */
export type RedfishMethod = 'GET' | 'POST' | 'PATCH';

/** An accepted answer: its status, parsed body and `ETag` header. */
export interface RedfishAnswer {
  readonly status: number;
  readonly body: unknown;
  readonly etag: string | undefined;
}

/** How one request is sent: see {@link RedfishTransport.send}. */
export interface RequestOptions {
  readonly actsTwice?: string | undefined;
  readonly ifMatch?: string | undefined;
  readonly conceal?: ((text: string) => string) | undefined;
}

const ACCEPTED = new Set([200, 202, 204]);
/** Network errors raised before a request went out: the connection was never made. */
const NOT_SENT = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
]);
/** Longest body read from a BMC: a ComputerSystem is a few KiB. */
const MAX_BODY_BYTES = 1024 * 1024;

/**
 * HTTP to the BMCs: basic authentication, TLS verified against the system
 * trust store or the given CA (or not at all for an `insecure` target, said
 * once per machine), a timeout on every request and retries with jitter for
 * network errors, timeouts and 5xx (never 4xx). A request that acts again
 * when repeated (a reset) is sent again only when it never went out (the
 * connection failed) or the BMC answered 5xx; after a timeout or a broken
 * connection its outcome is unknown ({@link PowerOutcomeUnknownError}).
 */
export class RedfishTransport {
  readonly #settings: Pick<RedfishClientSettings, 'timeout' | 'maxAttempts' | 'retryDelay'>;
  readonly #verified: Agent;
  #insecure: Agent | undefined;
  /** Machines already warned about (insecure TLS, plain http). */
  readonly #warned = new Set<string>();

  constructor(settings: RedfishClientSettings, ca: string | Buffer | undefined) {
    this.#settings = settings;
    this.#verified = new Agent({ connect: ca === undefined ? {} : { ca } });
  }

  /** Closes idle connections. */
  async close(): Promise<void> {
    await Promise.all([this.#verified.close(), this.#insecure?.close()]);
  }

  /**
   * One request with retries; resolves with the parsed body of an accepted
   * answer and its `ETag`. `actsTwice` names what a POST tells the BMC when
   * sending it again would act again (a `ForceRestart`): it is not sent
   * again once it may have reached the BMC. `ifMatch` is sent as `If-Match`
   * (the ETag of the resource a PATCH changes, which some BMCs require).
   * `conceal` is applied to the BMC's error text before it is put in an
   * error, so before any retry logs it: BMCs echo what they were sent (an
   * image URL whose path is a boot's capability) in their refusals.
   */
  async send(
    target: RedfishTarget,
    method: RedfishMethod,
    url: string,
    payload: unknown,
    signal: AbortSignal | undefined,
    options: RequestOptions = {},
  ): Promise<RedfishAnswer> {
    const dispatcher = this.#dispatcher(target, url);
    return retry(() => this.#attempt(target, dispatcher, method, url, payload, signal, options), {
      maxAttempts: this.#settings.maxAttempts,
      baseDelay: this.#settings.retryDelay,
      retryable: isPassingFailure,
      onRetry: (error, attempt, pause) =>
        log.redfish(
          'machine %s: %s %s failed (%s); attempt %d of %d in %d ms',
          target.machine,
          method,
          url,
          (error as Error).message,
          attempt + 1,
          this.#settings.maxAttempts,
          pause,
        ),
      signal,
    });
  }

  async #attempt(
    target: RedfishTarget,
    dispatcher: Dispatcher,
    method: RedfishMethod,
    url: string,
    payload: unknown,
    signal: AbortSignal | undefined,
    { actsTwice, ifMatch, conceal }: RequestOptions,
  ): Promise<RedfishAnswer> {
    const timeout = this.#settings.timeout;
    const timer = AbortSignal.timeout(timeout);
    const authorization = `Basic ${Buffer.from(`${target.username}:${target.password.reveal()}`).toString('base64')}`;
    let statusCode: number;
    let text: string;
    let etag: string | undefined;
    try {
      const response = await request(url, {
        method,
        dispatcher,
        signal: signal ? AbortSignal.any([signal, timer]) : timer,
        headers: {
          authorization,
          accept: 'application/json',
          'odata-version': '4.0',
          ...(payload === undefined ? {} : { 'content-type': 'application/json' }),
          ...(ifMatch === undefined ? {} : { 'if-match': ifMatch }),
        },
        ...(payload === undefined ? {} : { body: JSON.stringify(payload) }),
      });
      statusCode = response.statusCode;
      const header = response.headers.etag;
      etag = typeof header === 'string' ? header : undefined;
      text = await readBody(response.body);
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      const failure = timer.aborted
        ? new BmcTimeoutError(target.machine, 'redfish', url, method, timeout)
        : new BmcUnreachableError(
            target.machine,
            'redfish',
            url,
            `${method} failed: ${target.password.scrub(describeError(error))}`,
            { cause: error },
          );
      if (actsTwice !== undefined && (timer.aborted || !neverSent(error))) {
        throw new PowerOutcomeUnknownError(target.machine, actsTwice, failure);
      }
      throw failure;
    }
    if (statusCode === 401 || statusCode === 403) {
      throw new BmcCredentialsError(
        target.machine,
        'redfish',
        url,
        `BMC refused the credentials of user ${JSON.stringify(target.username)} (HTTP ${statusCode})`,
        target.username,
        statusCode,
      );
    }
    const accepted = method === 'GET' ? statusCode === 200 : ACCEPTED.has(statusCode);
    if (!accepted) {
      const shown = (message: string) => {
        const scrubbed = target.password.scrub(message);
        return conceal ? conceal(scrubbed) : scrubbed;
      };
      throw new RedfishHttpError(target.machine, url, method, statusCode, detail(text, shown));
    }
    if (text.trim() === '') return { status: statusCode, body: undefined, etag };
    try {
      return { status: statusCode, body: JSON.parse(text), etag };
    } catch {
      if (method !== 'GET') return { status: statusCode, body: undefined, etag };
      throw new BmcResponseError(
        target.machine,
        'redfish',
        url,
        `${method} answered HTTP ${statusCode} with a body that is not JSON`,
      );
    }
  }

  #dispatcher(target: RedfishTarget, url: string): Dispatcher {
    const protocol = new URL(url).protocol;
    if (protocol === 'http:') {
      this.#warnOnce(
        `${target.machine}/http`,
        'machine %s: BMC %s is plain http://: credentials and resets cross the network unencrypted',
        target.machine,
        target.url,
      );
      return this.#verified;
    }
    if (!target.insecure) return this.#verified;
    this.#warnOnce(
      `${target.machine}/insecure`,
      'machine %s: TLS certificate of BMC %s is not verified (insecure: true in the inventory)',
      target.machine,
      target.url,
    );
    this.#insecure ??= new Agent({ connect: { rejectUnauthorized: false } });
    return this.#insecure;
  }

  #warnOnce(key: string, format: string, ...args: unknown[]): void {
    if (this.#warned.has(key)) return;
    this.#warned.add(key);
    log.redfish(`warning: ${format}`, ...args);
  }
}

/** A failure another attempt may not meet: no answer (network, timeout) or a 5xx; never a 4xx. */
function isPassingFailure(error: unknown): boolean {
  return (
    error instanceof BmcUnreachableError ||
    error instanceof BmcTimeoutError ||
    (error instanceof RedfishHttpError && error.status >= 500)
  );
}

/** Whether a failed request never left: the connection could not be made. */
function neverSent(error: unknown): boolean {
  const code = error instanceof Error && 'code' in error ? error.code : undefined;
  return typeof code === 'string' && NOT_SENT.has(code);
}

async function readBody(body: Dispatcher.ResponseData['body']): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) {
      body.destroy();
      throw new Error(`answer larger than ${MAX_BODY_BYTES} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** A Redfish error body's message, or the start of the body, as `shown` shows it (before it is cut short, so nothing hidden is cut in half). */
function detail(text: string, shown: (message: string) => string): string {
  let message = text.trim();
  try {
    const parsed: unknown = JSON.parse(text);
    const error = isRecord(parsed) && isRecord(parsed.error) ? parsed.error : undefined;
    const extended = error?.['@Message.ExtendedInfo'];
    const first = Array.isArray(extended) && isRecord(extended[0]) ? extended[0].Message : undefined;
    if (typeof first === 'string') message = first;
    else if (typeof error?.message === 'string') message = error.message;
  } catch {}
  message = shown(message).replace(/\s+/g, ' ');
  return message.length > 200 ? `${message.slice(0, 197)}...` : message;
}
