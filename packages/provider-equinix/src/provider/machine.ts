import { Availability, type Machine } from '@bmaas/shepherd-manager';
import type { EquinixDevice, EquinixHardwareReservation } from '../api/types.js';
import { adoptionRefusal, deviceAddress, deviceReservationId } from './device-facts.js';

/**
 * A machine as the Equinix provider lists it: a device, or a free hardware
 * reservation (capacity). All fields are own enumerable properties, so a
 * spread copy (`{ ...machine, availability: 'KnownUnused' }`) still carries
 * what `createMachine` needs.
 */
export interface EquinixMachine extends Machine {
  /** For a device: its reservation. For capacity: the reservation a device would be created on. */
  readonly reservationId: string | undefined;
  /** Device hostname; `undefined` for a free reservation. */
  readonly hostname: string | undefined;
  /** Device state (`active`, `provisioning`, …); `undefined` for a free reservation. */
  readonly state: string | undefined;
}

/**
 * A device with the device prefix. One the shepherd could have created
 * (hostname = prefix + reservation ID) is `PossiblyUsed`: the provisioner
 * resolves it against the BMDB, and `createMachine` adopts it when the BMDB
 * lacks it. Failed devices and devices named otherwise are `KnownUsed`.
 */
export function deviceMachine(device: EquinixDevice, prefix: string, availability?: Availability): EquinixMachine {
  const failed = device.state === 'failed';
  return {
    id: device.id,
    address: deviceAddress(device),
    availability:
      availability ??
      (!failed && adoptionRefusal(device, prefix) === undefined ? Availability.PossiblyUsed : Availability.KnownUsed),
    failed,
    agentBoot: 'ssh',
    macs: [],
    reservationId: deviceReservationId(device),
    hostname: device.hostname,
    state: device.state,
  };
}

/** A free, provisionable reservation: capacity for one new machine. It has no provider ID yet. */
export function reservationMachine(reservation: EquinixHardwareReservation): EquinixMachine {
  return {
    id: undefined,
    address: undefined,
    availability: Availability.KnownUnused,
    failed: false,
    agentBoot: 'ssh',
    macs: [],
    reservationId: reservation.id,
    hostname: undefined,
    state: undefined,
  };
}
