/**
 * The static provider of the shepherd: machines the operator owns, listed in
 * an inventory file or URL, whose power is read and controlled through their
 * BMCs (Redfish, or IPMI through ipmitool), and which are power-cycled when
 * their agent goes silent; machines without an OS get their agent booted
 * through their BMC (Redfish virtual media, or a one-time network boot).
 * The Redfish and IPMI clients are usable on their own; a fake Redfish BMC
 * for tests lives in `@bmaas/provider-static/testing`.
 *
 * @packageDocumentation
 */

export { Secret } from '@bmaas/common';
export { PowerOutcomeUnknownError } from '@bmaas/shepherd-manager';
export { BOOT_OVERRIDE_ATTEMPTS } from './bmc.js';
export {
  BmcCredentialsError,
  BmcError,
  type BmcProtocol,
  BmcResponseError,
  BmcTimeoutError,
  BmcUnreachableError,
  BmcUnsupportedError,
  BootOverrideIgnoredError,
  InventoryError,
  type InventoryLocation,
  IpmiCommandError,
  IpmitoolMissingError,
  NoBmcError,
  RedfishHttpError,
  StaticProviderError,
  VirtualMediaUnsupportedError,
} from './errors.js';
export {
  type BmcPassword,
  type InventoryBmc,
  type InventoryBootMode,
  type InventoryIpmiBmc,
  type InventoryMachine,
  type InventoryRedfishBmc,
  InventorySource,
} from './inventory.js';
export {
  type IpmiBootDevice,
  IpmiClient,
  type IpmiPowerAction,
  type IpmiPowerState,
} from './ipmi/client.js';
export type { IpmiClientOptions, IpmiClientSettings } from './ipmi/client-settings.js';
export type { IpmiTarget } from './ipmi/target.js';
export {
  type DefaultBmcCredentials,
  STATIC_PROVIDER,
  type StaticMachine,
  StaticProvider,
  type StaticProviderOptions,
} from './provider.js';
export type { RedfishBootMode, RedfishBootOverrideResult, RedfishBootTarget } from './redfish/boot-override.js';
export { RedfishClient, type RedfishMediaResult, type RedfishResetResult } from './redfish/client.js';
export type { RedfishClientOptions, RedfishClientSettings } from './redfish/client-settings.js';
export { RESET_TYPES, type ResetType } from './redfish/reset-types.js';
export type { RedfishBootSettings, RedfishSystem } from './redfish/system.js';
export type { RedfishTarget } from './redfish/target.js';
