/**
 * The Equinix Metal provider of the shepherd: a typed API client, the
 * `Provider` that turns hardware reservations into BMDB machines,
 * power control through device actions (`EquinixPower`), and a status
 * updater keeping provider facts in the BMDB current. A fake
 * Equinix API for tests lives in `@bmaas/provider-equinix/testing`.
 *
 * @packageDocumentation
 */

export { Secret } from '@bmaas/common';
export {
  DEFAULT_EQUINIX_API_URL,
  type DeviceAction,
  type DeviceFilter,
  EquinixClient,
  type EquinixClientOptions,
  type EquinixClientSettings,
} from './api/client.js';
export type { RetryPolicy } from './api/retry.js';
export type {
  DeviceCreateRequest,
  DeviceState,
  EquinixDevice,
  EquinixHardwareReservation,
  EquinixIpAddress,
  EquinixRef,
  EquinixSshKey,
} from './api/types.js';
export {
  DeviceNotAdoptableError,
  DeviceNotRecordedError,
  EquinixApiError,
  EquinixError,
  EquinixRequestError,
  EquinixResponseError,
  ReservationTakenError,
  ReservationUnavailableError,
} from './errors.js';
export { EQUINIX_PROVIDER } from './provider/device-facts.js';
export type { EquinixMachine } from './provider/machine.js';
export { EquinixPower } from './provider/power.js';
export {
  EquinixProvider,
  type EquinixProviderOptions,
  type EquinixProviderSettings,
} from './provider/provider.js';
export {
  EquinixStatusUpdater,
  type EquinixStatusUpdaterOptions,
  type StatusSyncReport,
} from './status/status-updater.js';
