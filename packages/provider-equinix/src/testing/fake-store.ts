import { randomUUID } from 'node:crypto';
import type { EquinixDevice, EquinixHardwareReservation, EquinixIpAddress, EquinixSshKey } from '../api/types.js';

/** A device to seed the fake API with. */
export interface FakeDeviceSeed {
  readonly hostname: string;
  /** Default `active`. */
  readonly state?: string;
  /** Puts the device on this (existing) reservation, which is then taken. */
  readonly reservationId?: string;
  readonly tags?: readonly string[];
  readonly plan?: string;
  /** Facility code; `null` for a metro-only device. Default the API's facility. */
  readonly facility?: string | null;
  /** Metro code; default the API's metro. */
  readonly metro?: string | null;
  /** Public IPv4; `null` for none. Default: one is assigned if the device is not provisioning. */
  readonly ipv4?: string | null;
  /** Public IPv6; `null` for none. Default as `ipv4`. */
  readonly ipv6?: string | null;
  readonly id?: string;
}

/** A hardware reservation to seed the fake API with. */
export interface FakeReservationSeed {
  readonly id?: string;
  readonly plan?: string;
  readonly facility?: string | null;
  /** Default `true`. */
  readonly provisionable?: boolean;
}

interface StoredDevice {
  id: string;
  hostname: string;
  state: string;
  tags: string[];
  plan: string;
  facility: string | null;
  metro: string | null;
  reservationId: string | undefined;
  ipv4: string | undefined;
  ipv6: string | undefined;
  privateIpv4: string | undefined;
  /** Reads left before a provisioning device turns active. */
  readsLeft: number;
  reboots: number;
  /** Every device action accepted (`reboot`, `power_on`, `power_off`, …), oldest first. */
  actions: string[];
}

interface StoredReservation {
  id: string;
  plan: string;
  facility: string | null;
  provisionable: boolean;
  deviceId: string | undefined;
}

export interface StoreDefaults {
  /** The one public IPv4 of every device, if set; else one per device. */
  readonly publicIpv4?: string | undefined;
  readonly plan: string;
  readonly facility: string;
  readonly metro: string;
  readonly basePath: string;
  readonly provisioningReads: number;
}

/** The fake API's state: one project's devices, reservations and SSH keys. */
export class FakeStore {
  readonly devices = new Map<string, StoredDevice>();
  readonly reservations = new Map<string, StoredReservation>();
  readonly sshKeys = new Map<string, EquinixSshKey>();
  #addresses = 0;

  constructor(readonly defaults: StoreDefaults) {}

  addReservation(seed: FakeReservationSeed = {}): EquinixHardwareReservation {
    const reservation: StoredReservation = {
      id: seed.id ?? randomUUID(),
      plan: seed.plan ?? this.defaults.plan,
      facility: seed.facility === undefined ? this.defaults.facility : seed.facility,
      provisionable: seed.provisionable ?? true,
      deviceId: undefined,
    };
    this.reservations.set(reservation.id, reservation);
    return this.renderReservation(reservation);
  }

  addDevice(seed: FakeDeviceSeed): EquinixDevice {
    const reservation = seed.reservationId === undefined ? undefined : this.reservations.get(seed.reservationId);
    if (seed.reservationId !== undefined && !reservation) {
      throw new Error(`fake Equinix API: no reservation ${seed.reservationId} to put device ${seed.hostname} on`);
    }
    const state = seed.state ?? 'active';
    const addressed = !['queued', 'provisioning'].includes(state);
    const n = ++this.#addresses;
    const device: StoredDevice = {
      id: seed.id ?? randomUUID(),
      hostname: seed.hostname,
      state,
      tags: [...(seed.tags ?? [])],
      plan: seed.plan ?? reservation?.plan ?? this.defaults.plan,
      facility: seed.facility === undefined ? (reservation?.facility ?? this.defaults.facility) : seed.facility,
      metro: seed.metro === undefined ? this.defaults.metro : seed.metro,
      reservationId: reservation?.id,
      ipv4: seed.ipv4 === null ? undefined : (seed.ipv4 ?? (addressed ? this.#publicIpv4(n) : undefined)),
      ipv6: seed.ipv6 === null ? undefined : (seed.ipv6 ?? (addressed ? publicIpv6(n) : undefined)),
      privateIpv4: addressed ? `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}` : undefined,
      readsLeft: state === 'provisioning' ? this.defaults.provisioningReads : 0,
      reboots: 0,
      actions: [],
    };
    this.devices.set(device.id, device);
    if (reservation) {
      reservation.deviceId = device.id;
      reservation.provisionable = false;
    }
    return this.renderDevice(device);
  }

  /** Deletes a device (the API answers 404 for it from now on) and frees its reservation. */
  removeDevice(id: string): void {
    const device = this.devices.get(id);
    if (!device) return;
    this.devices.delete(id);
    const reservation = device.reservationId === undefined ? undefined : this.reservations.get(device.reservationId);
    if (reservation?.deviceId === id) {
      reservation.deviceId = undefined;
      reservation.provisionable = true;
    }
  }

  setDeviceState(id: string, state: string): void {
    const device = this.#device(id);
    device.state = state;
    device.readsLeft = 0;
    if (state === 'active') this.#address(device);
  }

  /** Turns a provisioning device active and gives it addresses. */
  activate(device: StoredDevice): void {
    device.state = 'active';
    device.readsLeft = 0;
    this.#address(device);
  }

  /**
   * A read of the device through the API: a provisioning device counts down
   * its reads and turns active when they run out.
   */
  read(device: StoredDevice): EquinixDevice {
    if (device.state === 'provisioning' && Number.isFinite(device.readsLeft)) {
      if (device.readsLeft <= 0) this.activate(device);
      else device.readsLeft--;
    }
    return this.renderDevice(device);
  }

  renderDevice(device: StoredDevice): EquinixDevice {
    const addresses: EquinixIpAddress[] = [];
    if (device.ipv4) addresses.push({ address: device.ipv4, public: true, address_family: 4, management: true });
    if (device.ipv6) addresses.push({ address: device.ipv6, public: true, address_family: 6, management: true });
    if (device.privateIpv4) {
      addresses.push({ address: device.privateIpv4, public: false, address_family: 4, management: true });
    }
    const base = this.defaults.basePath;
    return {
      id: device.id,
      href: `${base}/devices/${device.id}`,
      hostname: device.hostname,
      state: device.state,
      tags: [...device.tags],
      ip_addresses: addresses,
      hardware_reservation: device.reservationId
        ? { href: `${base}/hardware-reservations/${device.reservationId}` }
        : null,
      facility: device.facility === null ? null : { code: device.facility },
      metro: device.metro === null ? null : { code: device.metro },
      plan: { slug: device.plan },
    } as EquinixDevice;
  }

  renderReservation(reservation: StoredReservation): EquinixHardwareReservation {
    const base = this.defaults.basePath;
    return {
      id: reservation.id,
      href: `${base}/hardware-reservations/${reservation.id}`,
      provisionable: reservation.provisionable,
      device: reservation.deviceId ? { href: `${base}/devices/${reservation.deviceId}` } : null,
      plan: { slug: reservation.plan },
      facility: reservation.facility === null ? null : { code: reservation.facility },
    } as EquinixHardwareReservation;
  }

  reboots(id: string): number {
    return this.#device(id).reboots;
  }

  actions(id: string): readonly string[] {
    return [...this.#device(id).actions];
  }

  #device(id: string): StoredDevice {
    const device = this.devices.get(id);
    if (!device) throw new Error(`fake Equinix API: no device ${id}`);
    return device;
  }

  #publicIpv4(n: number): string {
    return this.defaults.publicIpv4 ?? publicIpv4(n);
  }

  #address(device: StoredDevice): void {
    if (device.ipv4 && device.ipv6) return;
    const n = ++this.#addresses;
    device.ipv4 ??= this.#publicIpv4(n);
    device.ipv6 ??= publicIpv6(n);
    device.privateIpv4 ??= `10.${(n >> 16) & 255}.${(n >> 8) & 255}.${n & 255}`;
  }
}

export type { StoredDevice, StoredReservation };

/** Addresses from 198.18.0.0/15 (benchmarking, never routed), one per device. */
function publicIpv4(n: number): string {
  return `198.${18 + ((n >> 16) & 1)}.${(n >> 8) & 255}.${n & 255}`;
}

function publicIpv6(n: number): string {
  return `2001:db8::${n.toString(16)}`;
}
