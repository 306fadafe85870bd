import { RateLimiter } from '@bmaas/bmdb-controlloop';
import { afterAll, afterEach } from 'vitest';
import { EquinixClient, type EquinixClientOptions } from '../src/index.js';
import { FakeEquinixApi, type FakeEquinixApiOptions } from '../src/testing/index.js';

/** A fake API stopped after the file's tests. */
export async function startFake(options: FakeEquinixApiOptions = {}): Promise<FakeEquinixApi> {
  const api = await FakeEquinixApi.start(options);
  afterAll(() => api.close());
  return api;
}

/** A client for `api` with millisecond retries, so failure tests run fast. */
export function fastClient(api: FakeEquinixApi, options: Partial<EquinixClientOptions> = {}): EquinixClient {
  return new EquinixClient({
    apiKey: api.apiKey,
    baseUrl: api.url,
    requestTimeout: 2_000,
    rateLimiter: new RateLimiter(1, 1_000),
    ...options,
    retry: { baseDelay: 1, maxDelay: 5, ...options.retry },
  });
}

/** Clears the fake's faults after each test, so one test's leftovers do not hit the next. */
export function resetFaultsAfterEach(api: () => FakeEquinixApi | undefined): void {
  afterEach(() => api()?.clearFaults());
}
