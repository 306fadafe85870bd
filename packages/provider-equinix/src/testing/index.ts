/**
 * Test support: a fake Equinix Metal API served over real HTTP on
 * 127.0.0.1, for this package's tests and for tests of packages built on it.
 *
 * @packageDocumentation
 */

export { FakeEquinixApi, type FakeEquinixApiOptions } from './fake-api.js';
export type { FakeDeviceSeed, FakeReservationSeed } from './fake-store.js';
export type { FakeFault } from './faults.js';
export type { FakeRequest, FakeRoute } from './routes.js';
