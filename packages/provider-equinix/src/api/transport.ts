import { performance } from 'node:perf_hooks';
import type { RateLimiter } from '@bmaas/bmdb-controlloop';
import { describeError, retry, type Secret, type Semaphore } from '@bmaas/common';
import { EquinixApiError, type EquinixError, EquinixRequestError, EquinixResponseError } from '../errors.js';
import { log } from '../internal/log.js';
import type { EquinixApiMetrics } from './metrics.js';
import { parseRetryAfter, type RetryPolicy } from './retry.js';

export type HttpMethod = 'GET' | 'POST' | 'PUT';

export interface TransportOptions {
  readonly baseUrl: string;
  readonly apiKey: Secret;
  readonly consumerToken: string | undefined;
  readonly requestTimeout: number;
  readonly concurrency: Semaphore;
  readonly rateLimiter: RateLimiter;
  readonly retry: RetryPolicy;
  readonly metrics: EquinixApiMetrics | undefined;
  readonly userAgent: string;
}

export interface ApiRequest<T> {
  readonly method: HttpMethod;
  /** Path template, for metrics and logs: `/devices/{id}`. */
  readonly route: string;
  /** Path under the base URL: `/devices/9f1c…`. */
  readonly path: string;
  readonly query?: Readonly<Record<string, string | number | undefined>>;
  readonly body?: unknown;
  /**
   * Sending the request twice does no more than sending it once (GET, PUT, a
   * reboot). Other requests are repeated after an attempt with an unknown
   * outcome only if `recover` finds no trace of that attempt.
   */
  readonly repeatable: boolean;
  /**
   * For a request that is not repeatable: looks for the effect of an attempt
   * whose answer was lost (network error, timeout, 5xx) and returns it, or
   * `undefined` if there is none.
   */
  readonly recover?: (signal: AbortSignal | undefined) => Promise<T | undefined>;
  /** Turns the JSON body into the result; throws `EquinixResponseError` if it does not fit. */
  readonly parse: (body: unknown) => T;
  readonly signal?: AbortSignal | undefined;
}

/** A failed attempt, as the transport judges it. */
interface Failure {
  readonly ok: false;
  readonly error: EquinixError;
  /** Worth another attempt. */
  readonly retry: boolean;
  /** The API may have acted on the request although we saw no success. */
  readonly uncertain: boolean;
  readonly retryAfter?: number | undefined;
  /** Short label for logs and the retries metric. */
  readonly reason: string;
}

type Outcome<T> = { readonly ok: true; readonly value: T } | Failure;

/**
 * Sends requests to the Equinix API: concurrency slots and rate-limit
 * tokens first, a timeout on every attempt, retries with jittered
 * exponential backoff for network errors, timeouts, 429 and 5xx (honouring
 * `Retry-After`), and none for other client errors.
 */
export class Transport {
  constructor(private readonly options: TransportOptions) {}

  async request<T>(spec: ApiRequest<T>): Promise<T> {
    const policy = this.options.retry;
    // The last attempt's failure as #attempt judged it: whether another may
    // help, whether the API may have acted, how long the API asked to wait.
    let failed: Failure | undefined;
    const isFailed = (error: unknown): error is EquinixError => failed !== undefined && error === failed.error;
    try {
      return await retry(
        async (attempt) => {
          if (failed?.uncertain && !spec.repeatable) {
            // The previous attempt may have worked: look before doing it again.
            const found = await this.#recover(spec);
            if (found !== undefined) return found;
          }
          const outcome = await this.#attempt(spec, attempt);
          if (outcome.ok) return outcome.value;
          failed = outcome;
          throw outcome.error;
        },
        {
          maxAttempts: policy.maxAttempts,
          baseDelay: policy.baseDelay,
          maxDelay: policy.maxDelay,
          retryable: (error) =>
            isFailed(error) &&
            failed?.retry === true &&
            (spec.repeatable || !failed.uncertain || spec.recover !== undefined),
          requestedPause: (error) =>
            isFailed(error) && failed?.retryAfter !== undefined
              ? Math.min(failed.retryAfter, policy.maxRetryAfter)
              : undefined,
          onRetry: (_error, attempt, pause) => {
            const reason = failed?.reason ?? 'unknown';
            log.api('%s %s attempt %d failed (%s); retrying in %dms', spec.method, spec.path, attempt, reason, pause);
            this.options.metrics?.retries.inc({ method: spec.method, endpoint: spec.route, reason });
          },
          signal: spec.signal,
        },
      );
    } catch (error) {
      if (isFailed(error) && failed?.uncertain && !spec.repeatable) {
        const found = await this.#recover(spec);
        if (found !== undefined) return found;
      }
      throw error;
    }
  }

  async #recover<T>(spec: ApiRequest<T>): Promise<T | undefined> {
    if (!spec.recover) return undefined;
    const found = await spec.recover(spec.signal);
    if (found !== undefined) {
      log.api('%s %s: found the result of an attempt whose answer was lost', spec.method, spec.path);
    }
    return found;
  }

  async #attempt<T>(spec: ApiRequest<T>, attempt: number): Promise<Outcome<T>> {
    const { method, route, path, signal } = spec;
    const labels = { method, endpoint: route };
    const metrics = this.options.metrics;
    const release = await this.#acquire(labels, signal);
    metrics?.requestsInFlight.inc(labels);
    const started = performance.now();
    const observe = (status: string) =>
      metrics?.requestDuration.observe({ ...labels, status }, (performance.now() - started) / 1000);
    const timeout = AbortSignal.timeout(this.options.requestTimeout);
    const failure = (error: unknown): Outcome<T> => {
      if (signal?.aborted) throw signal.reason;
      const timedOut = timeout.aborted;
      observe(timedOut ? 'timeout' : 'network_error');
      return {
        ok: false,
        error: new EquinixRequestError(
          method,
          path,
          timedOut,
          attempt,
          timedOut ? `no answer within ${this.options.requestTimeout}ms` : this.#scrub(describeError(error)),
          { cause: error },
        ),
        retry: true,
        uncertain: true,
        reason: timedOut ? 'timeout' : 'network_error',
      };
    };
    try {
      let response: Response;
      let text: string;
      try {
        response = await fetch(this.#url(spec), {
          method,
          headers: this.#headers(spec.body !== undefined),
          body: spec.body === undefined ? undefined : JSON.stringify(spec.body),
          signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
        });
        text = await response.text();
      } catch (error) {
        return failure(error);
      }
      observe(String(response.status));
      if (response.ok) return this.#parse(spec, text, attempt);
      const status = response.status;
      const error = new EquinixApiError(
        method,
        path,
        status,
        this.#scrub(apiMessage(text, response.statusText, status)),
        attempt,
      );
      const retryAfter = parseRetryAfter(response.headers.get('retry-after'));
      if (status === 429) return { ok: false, error, retry: true, uncertain: false, retryAfter, reason: 'http_429' };
      if (status >= 500 || status === 408) {
        return { ok: false, error, retry: true, uncertain: true, retryAfter, reason: `http_${status}` };
      }
      return { ok: false, error, retry: false, uncertain: false, reason: `http_${status}` };
    } finally {
      metrics?.requestsInFlight.dec(labels);
      release();
    }
  }

  #parse<T>(spec: ApiRequest<T>, text: string, attempt: number): Outcome<T> {
    try {
      const body: unknown = text.trim() === '' ? undefined : JSON.parse(text);
      return { ok: true, value: spec.parse(body) };
    } catch (error) {
      const detail = error instanceof EquinixResponseError ? error : undefined;
      return {
        ok: false,
        error:
          detail ?? new EquinixResponseError(spec.method, spec.path, `${describeError(error)} (attempt ${attempt})`),
        // A truncated or garbled body: the request itself may well have worked.
        retry: true,
        uncertain: true,
        reason: 'malformed_response',
      };
    }
  }

  /** A concurrency slot, then a rate-limit token; resolves to the slot's release. */
  async #acquire(labels: { method: string; endpoint: string }, signal: AbortSignal | undefined): Promise<() => void> {
    const waiting = this.options.metrics?.requestsWaiting;
    waiting?.inc(labels);
    try {
      const release = await this.options.concurrency.acquire(signal);
      try {
        await this.options.rateLimiter.wait(signal);
      } catch (error) {
        release();
        throw error;
      }
      return release;
    } finally {
      waiting?.dec(labels);
    }
  }

  #url(spec: ApiRequest<unknown>): URL {
    const url = new URL(`${this.options.baseUrl}${spec.path}`);
    for (const [key, value] of Object.entries(spec.query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, String(value));
    }
    return url;
  }

  #headers(hasBody: boolean): Record<string, string> {
    const headers: Record<string, string> = {
      accept: 'application/json',
      'user-agent': this.options.userAgent,
      'x-auth-token': this.options.apiKey.reveal(),
    };
    if (this.options.consumerToken) headers['x-consumer-token'] = this.options.consumerToken;
    if (hasBody) headers['content-type'] = 'application/json';
    return headers;
  }

  #scrub(text: string): string {
    return this.options.apiKey.scrub(text);
  }
}

/** The API's explanation of an error: `{"errors": [...]}`, `{"error": "..."}`, or the raw text. */
export function apiMessage(text: string, statusText: string, status: number): string {
  try {
    const body: unknown = JSON.parse(text);
    if (typeof body === 'object' && body !== null) {
      const { errors, error } = body as { errors?: unknown; error?: unknown };
      if (Array.isArray(errors) && errors.length > 0) return errors.map(String).join('; ');
      if (typeof error === 'string' && error !== '') return error;
    }
  } catch {
    // Not JSON: fall through to the raw text.
  }
  const raw = text.trim().replace(/\s+/g, ' ');
  if (raw !== '' && !raw.startsWith('<')) return raw.length > 300 ? `${raw.slice(0, 300)}…` : raw;
  return statusText || `HTTP ${status}`;
}
