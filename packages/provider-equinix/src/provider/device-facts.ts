import { PowerState, ProviderStatus } from '@bmaas/bmdb-model';
import { type EquinixDevice, refId } from '../api/types.js';

/** The provider name the BMDB knows Equinix machines by (`machine_provided.provider`). */
export const EQUINIX_PROVIDER = 'Equinix';

/** What the BMDB records about a device (the Provided tag's provider fields). */
export interface DeviceFacts {
  readonly providerReservationId?: string;
  readonly providerIpAddress: string | null;
  readonly providerLocation: string | null;
  readonly providerStatus: ProviderStatus;
}

/**
 * The BMDB provider status for an Equinix device state: `active` is Running,
 * `deleted` Missing, `failed` ProvisioningFailedPermanent, `inactive` and
 * powering on/off Stopped, queued/provisioning/reinstalling/post_provisioning
 * Provisioning, anything else Unknown.
 */
export function providerStatusForState(state: string): ProviderStatus {
  switch (state) {
    case 'active':
      return ProviderStatus.Running;
    case 'deleted':
      return ProviderStatus.Missing;
    case 'failed':
      return ProviderStatus.ProvisioningFailedPermanent;
    case 'inactive':
    case 'powering_on':
    case 'powering_off':
      return ProviderStatus.Stopped;
    case 'queued':
    case 'provisioning':
    case 'reinstalling':
    case 'post_provisioning':
      return ProviderStatus.Provisioning;
    default:
      return ProviderStatus.Unknown;
  }
}

/**
 * The power state an Equinix device state says: `active` is On, `inactive`
 * Off, `powering_on`/`powering_off` on their way; a device being
 * provisioned, reinstalled, failed or deleted has none to tell (Unknown).
 */
export function powerStateForState(state: string): PowerState {
  switch (state) {
    case 'active':
      return PowerState.On;
    case 'inactive':
      return PowerState.Off;
    case 'powering_on':
      return PowerState.PoweringOn;
    case 'powering_off':
      return PowerState.PoweringOff;
    default:
      return PowerState.Unknown;
  }
}

/** The address the shepherd reaches a device at: its public IPv4, else its public IPv6. */
export function deviceAddress(device: EquinixDevice): string | undefined {
  const addresses = (device.ip_addresses ?? []).filter((ip) => ip.public && typeof ip.address === 'string');
  return (
    addresses.find((ip) => ip.address_family === 4)?.address ?? addresses.find((ip) => ip.address_family === 6)?.address
  );
}

/** Where a device is: its facility code, else its metro code. */
export function deviceLocation(device: EquinixDevice): string | undefined {
  return device.facility?.code || device.metro?.code || undefined;
}

/** The hardware reservation a device runs on, if any. */
export function deviceReservationId(device: EquinixDevice): string | undefined {
  return refId(device.hardware_reservation);
}

export function deviceFacts(device: EquinixDevice): DeviceFacts {
  const reservationId = deviceReservationId(device);
  return {
    // Unknown stays unknown: a device listed without its reservation keeps the recorded one.
    ...(reservationId === undefined ? {} : { providerReservationId: reservationId }),
    providerIpAddress: deviceAddress(device) ?? null,
    providerLocation: deviceLocation(device) ?? null,
    providerStatus: providerStatusForState(device.state),
  };
}

/** The hostname the shepherd gives the device it creates on a reservation. */
export function hostnameFor(prefix: string, reservationId: string): string {
  return prefix + reservationId.slice(0, 18);
}

/**
 * Why the shepherd cannot claim `device` as one it created, or `undefined` if
 * it can: the hostname must be `prefix` + the first 18 characters of the
 * device's own reservation ID, and the device must not have failed.
 */
export function adoptionRefusal(device: EquinixDevice, prefix: string): string | undefined {
  if (!device.hostname.startsWith(prefix)) return `hostname does not start with the device prefix ${prefix}`;
  const reservationId = deviceReservationId(device);
  if (reservationId === undefined) return 'it is not on a hardware reservation';
  if (device.hostname !== hostnameFor(prefix, reservationId)) {
    return `hostname is not ${hostnameFor(prefix, reservationId)}, the name the shepherd gives a device on reservation ${reservationId}`;
  }
  if (device.state === 'failed') return 'it failed provisioning';
  return undefined;
}
