/**
 * The static provider of the shepherd: machines the operator owns, listed in
 * an inventory file or URL, whose power is read and controlled through their
 * BMCs (a `Bmc` port; Redfish today), and which are power-cycled when their
 * agent goes silent. The Redfish client is usable on its own;
 * a fake Redfish BMC for tests lives in `@bmaas/provider-static/testing`.
 *
 * @packageDocumentation
 */

export { Secret } from '@bmaas/shepherd-manager';
export type { Bmc } from './bmc.js';
export {
  BmcCredentialsError,
  InventoryError,
  type InventoryLocation,
  IpmiCommandError,
  IpmiCredentialsError,
  IpmiError,
  IpmiTimeoutError,
  IpmitoolMissingError,
  IpmiUnreachableError,
  IpmiUnsupportedError,
  NoBmcError,
  RedfishCredentialsError,
  RedfishError,
  RedfishHttpError,
  RedfishNetworkError,
  RedfishResetUnsupportedError,
  RedfishResponseError,
  RedfishTimeoutError,
  StaticProviderError,
} from './errors.js';
export {
  type BmcPassword,
  type InventoryBmc,
  type InventoryIpmiBmc,
  type InventoryMachine,
  type InventoryRedfishBmc,
  InventorySource,
  parseInventory,
} from './inventory.js';
export { IpmiBmc } from './ipmi/bmc.js';
export {
  IPMI_BOOT_DEVICES,
  type IpmiBootDevice,
  IpmiClient,
  type IpmiPowerAction,
  type IpmiPowerState,
} from './ipmi/client.js';
export type { IpmiClientOptions, IpmiClientSettings } from './ipmi/client-settings.js';
export type { IpmiTarget } from './ipmi/target.js';
export {
  type DefaultBmcCredentials,
  readPasswordFile,
  STATIC_PROVIDER,
  type StaticMachine,
  StaticProvider,
  type StaticProviderOptions,
} from './provider.js';
export { powerStateOf, RedfishBmc } from './redfish/bmc.js';
export { RedfishClient, type RedfishReset } from './redfish/client.js';
export type { RedfishClientOptions, RedfishClientSettings } from './redfish/client-settings.js';
export {
  chooseAllowed,
  chooseResetType,
  POWER_OFF_TYPES,
  POWER_ON_TYPES,
  RESET_TYPES,
  RESTART_PREFERENCE,
  type ResetType,
  SHUTDOWN_TYPES,
} from './redfish/reset-types.js';
export type { RedfishSystem } from './redfish/system.js';
export type { RedfishTarget } from './redfish/target.js';
