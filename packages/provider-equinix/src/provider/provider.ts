import type { Session } from '@bmaas/bmdb-controlloop';
import { addProvided, newMachine, updateProviderStatus } from '@bmaas/bmdb-model';
import { describeError, isAbortOf } from '@bmaas/common';
import { Availability, type CreateMachineRequest, MachineNotFoundError, type Provider } from '@bmaas/shepherd-manager';
import type { EquinixClient } from '../api/client.js';
import type { EquinixDevice } from '../api/types.js';
import {
  DeviceNotAdoptableError,
  DeviceNotRecordedError,
  EquinixApiError,
  EquinixError,
  ReservationTakenError,
  ReservationUnavailableError,
} from '../errors.js';
import { detail, log } from '../internal/log.js';
import { adoptionRefusal, deviceFacts, deviceReservationId, EQUINIX_PROVIDER, hostnameFor } from './device-facts.js';
import { deviceMachine, type EquinixMachine, reservationMachine } from './machine.js';
import { PenaltyBox } from './penalty-box.js';
import { ReservationCache } from './reservation-cache.js';
import { ProjectSshKey } from './ssh-key.js';

/** Options for {@link EquinixProvider}. Durations in milliseconds. */
export interface EquinixProviderOptions {
  readonly client: EquinixClient;
  /** `--equinix-project-id`. */
  readonly projectId: string;
  /** `--equinix-device-prefix`: devices whose hostname starts with it are the shepherd's. */
  readonly devicePrefix: string;
  /** `--equinix-os`: operating system slug new devices get (e.g. `ubuntu_22_04`). */
  readonly os: string;
  /** `--equinix-ssh-key-label`: label of the shepherd's key among the project's SSH keys. */
  readonly sshKeyLabel: string;
  /** The shepherd's SSH public key, in authorized_keys form (`ssh-ed25519 AAAA… comment`). */
  readonly sshPublicKey: string;
  /**
   * `--equinix-use-project-keys`: install every project key on new devices
   * instead of only the shepherd's. Default false.
   */
  readonly useProjectKeys?: boolean | undefined;
  /** Extra tags for new devices. */
  readonly tags?: readonly string[] | undefined;
  /** `--equinix-reservation-cache-timeout`: how long a reservation listing is reused. Default 15 min. */
  readonly reservationCacheTimeout?: number | undefined;
  /** How long a reservation whose device creation failed is left alone. Default 1 h. */
  readonly penaltyDuration?: number | undefined;
}

/** The provider's settings after defaults (no secrets: the API key stays in the client). */
export interface EquinixProviderSettings {
  readonly projectId: string;
  readonly devicePrefix: string;
  readonly os: string;
  readonly sshKeyLabel: string;
  readonly useProjectKeys: boolean;
  readonly tags: readonly string[];
  readonly reservationCacheTimeout: number;
  readonly penaltyDuration: number;
}

/**
 * The shepherd's Equinix Metal provider: devices whose hostname starts with
 * the device prefix are its machines, and free hardware reservations are its
 * capacity. `createMachine` creates a device on a reservation (or adopts a
 * device the shepherd created but never recorded) and records it in the
 * BMDB. See the package README for the contract with the provisioner.
 *
 * @example
 * ```ts
 * const provider = new EquinixProvider({ client, projectId, devicePrefix: 'bmaas-', os: 'ubuntu_22_04',
 *   sshKeyLabel: 'bmaas-shepherd', sshPublicKey });
 * const machines = await provider.listMachines();
 * ```
 */
export class EquinixProvider implements Provider {
  /** The provider name in the BMDB: `Equinix`. */
  readonly type = EQUINIX_PROVIDER;
  readonly settings: EquinixProviderSettings;
  readonly #client: EquinixClient;
  readonly #reservations: ReservationCache;
  readonly #penalties: PenaltyBox;
  readonly #sshKey: ProjectSshKey;

  constructor(options: EquinixProviderOptions) {
    for (const key of ['projectId', 'devicePrefix', 'os'] as const) {
      if (typeof options[key] !== 'string' || options[key] === '') {
        throw new TypeError(`EquinixProvider: ${key} must be a non-empty string`);
      }
    }
    this.settings = Object.freeze({
      projectId: options.projectId,
      devicePrefix: options.devicePrefix,
      os: options.os,
      sshKeyLabel: options.sshKeyLabel,
      useProjectKeys: options.useProjectKeys ?? false,
      tags: Object.freeze([...(options.tags ?? [])]),
      reservationCacheTimeout: duration('reservationCacheTimeout', options.reservationCacheTimeout ?? 15 * 60_000),
      penaltyDuration: duration('penaltyDuration', options.penaltyDuration ?? 60 * 60_000),
    });
    this.#client = options.client;
    this.#sshKey = new ProjectSshKey(options.client, options.projectId, options.sshKeyLabel, options.sshPublicKey);
    this.#reservations = new ReservationCache(
      (signal) => options.client.listReservations(options.projectId, signal),
      this.settings.reservationCacheTimeout,
    );
    this.#penalties = new PenaltyBox(this.settings.penaltyDuration);
  }

  /**
   * The shepherd's devices and the free capacity: every device with the
   * prefix (`PossiblyUsed` if the shepherd could have created it, else
   * `KnownUsed`; failed ones `KnownUsed` and `failed`), then every
   * provisionable reservation without a device and outside the penalty box
   * (`KnownUnused`, `id` undefined, `reservationId` set).
   */
  async listMachines(signal?: AbortSignal): Promise<EquinixMachine[]> {
    const [devices, reservations] = await Promise.all([this.managedDevices(signal), this.#reservations.get(signal)]);
    const prefix = this.settings.devicePrefix;
    const machines = devices.map((device) => deviceMachine(device, prefix));
    // A listing from the cache may predate our own newest devices.
    const ours = new Set(devices.map((device) => device.hostname));
    let penalised = 0;
    for (const reservation of reservations) {
      if (!reservation.provisionable || reservation.device) continue;
      if (this.#penalties.isPenalised(reservation.id)) {
        penalised++;
        continue;
      }
      if (ours.has(hostnameFor(prefix, reservation.id))) continue;
      machines.push(reservationMachine(reservation));
    }
    detail.provider(
      'project %s: %d managed device(s), %d free reservation(s), %d penalised',
      this.settings.projectId,
      devices.length,
      machines.length - devices.length,
      penalised,
    );
    return machines;
  }

  /**
   * One device by ID.
   *
   * @throws {@link MachineNotFoundError} when the API does not know it
   */
  async getMachine(id: string, signal?: AbortSignal): Promise<EquinixMachine> {
    return deviceMachine(await this.#device(id, signal), this.settings.devicePrefix);
  }

  /**
   * Takes `request.unusedMachine` into use and records it in the BMDB (a new
   * machine with its Provided tag, in one transaction):
   *
   * - with an `id` (a device listed `PossiblyUsed` that the BMDB lacks): the
   *   device is adopted, i.e. only recorded, after checking its hostname is
   *   the one the shepherd gives a device on its reservation;
   * - with a `reservationId` and no `id` (`KnownUnused`): a device is created
   *   on the reservation (hostname prefix + first 18 characters of the
   *   reservation ID, the reservation's plan, the configured OS, the shepherd's
   *   SSH key, the configured tags). If creation fails, the reservation is
   *   penalised for `penaltyDuration`.
   *
   * A device already recorded in the BMDB is not recorded twice: its facts are
   * refreshed and it is returned.
   *
   * @throws {@link ReservationTakenError} when someone else took the reservation
   * @throws {@link DeviceNotAdoptableError} for a device the shepherd did not create
   * @throws {@link DeviceNotRecordedError} when the device exists but the BMDB
   *   write failed (it will be listed as adoptable)
   */
  async createMachine(session: Session, request: CreateMachineRequest, signal?: AbortSignal): Promise<EquinixMachine> {
    const target = request.unusedMachine as Partial<EquinixMachine>;
    if (typeof target.id === 'string') return this.#adopt(session, target.id, signal);
    if (typeof target.reservationId === 'string') return this.#create(session, target.reservationId, signal);
    throw new EquinixError(
      'createMachine: the machine has neither a device ID nor a reservation ID; pass one that EquinixProvider.listMachines returned',
    );
  }

  /** Every device of the project whose hostname starts with the device prefix. */
  async managedDevices(signal?: AbortSignal): Promise<EquinixDevice[]> {
    const devices = await this.#client.listDevices(this.settings.projectId, {}, signal);
    return devices.filter((device) => device.hostname.startsWith(this.settings.devicePrefix));
  }

  /**
   * Makes sure the project holds the shepherd's SSH key under its label
   * (adding or replacing it) and returns the key's ID. Runs before every
   * creation; call it at start-up to fail early on bad credentials.
   */
  ensureSshKey(signal?: AbortSignal): Promise<string> {
    return this.#sshKey.ensure(signal);
  }

  async #create(session: Session, reservationId: string, signal: AbortSignal | undefined): Promise<EquinixMachine> {
    const { projectId, devicePrefix, os, useProjectKeys, tags } = this.settings;
    const penaltyEnds = this.#penalties.until(reservationId);
    if (penaltyEnds !== undefined) {
      throw new ReservationUnavailableError(reservationId, `penalised until ${new Date(penaltyEnds).toISOString()}`);
    }
    // Only the plan is needed: a listing from before the last invalidation will do.
    const reservation =
      this.#reservations.lastKnown(reservationId) ??
      (await this.#reservations.get(signal)).find((r) => r.id === reservationId);
    if (!reservation) {
      throw new ReservationUnavailableError(reservationId, `not a hardware reservation of project ${projectId}`);
    }
    // A key problem is not the reservation's fault: no penalty for it.
    const keyId = await this.#sshKey.ensure(signal);
    const hostname = hostnameFor(devicePrefix, reservationId);
    let device: EquinixDevice;
    try {
      device = await this.#client.createDevice(
        projectId,
        {
          hostname,
          plan: reservation.plan.slug,
          operating_system: os,
          hardware_reservation_id: reservationId,
          ...(useProjectKeys ? {} : { project_ssh_keys: [keyId] }),
          tags,
        },
        signal,
      );
    } catch (error) {
      this.#reservations.invalidate();
      if (isAbortOf(error, signal)) throw error;
      // The device on the reservation may be ours from an attempt whose record was lost.
      const ours = error instanceof ReservationTakenError ? await this.#ownDeviceOn(reservationId, signal) : undefined;
      if (ours) return this.#record(session, ours, 'adopted after a lost race with itself');
      // A create refused over the key means it was removed under us: look it up again next time.
      this.#sshKey.forget();
      const until = this.#penalties.add(reservationId);
      log.provider(
        'creating device %s on reservation %s failed; penalised until %s: %s',
        hostname,
        reservationId,
        new Date(until).toISOString(),
        describeError(error),
      );
      throw error;
    }
    this.#reservations.invalidate();
    detail.provider('created device %s (%s) on reservation %s', device.id, hostname, reservationId);
    return this.#record(session, device, 'created');
  }

  async #adopt(session: Session, deviceId: string, signal: AbortSignal | undefined): Promise<EquinixMachine> {
    const device = await this.#device(deviceId, signal);
    const refusal = adoptionRefusal(device, this.settings.devicePrefix);
    if (refusal !== undefined) throw new DeviceNotAdoptableError(device.id, device.hostname, refusal);
    return this.#record(session, device, 'adopted');
  }

  async #ownDeviceOn(reservationId: string, signal: AbortSignal | undefined): Promise<EquinixDevice | undefined> {
    const hostname = hostnameFor(this.settings.devicePrefix, reservationId);
    let devices: EquinixDevice[];
    try {
      devices = await this.managedDevices(signal);
    } catch (error) {
      if (isAbortOf(error, signal)) throw error;
      log.provider('looking for our own device on reservation %s failed: %s', reservationId, describeError(error));
      return undefined;
    }
    return devices.find(
      (device) =>
        device.hostname === hostname &&
        deviceReservationId(device) === reservationId &&
        adoptionRefusal(device, this.settings.devicePrefix) === undefined,
    );
  }

  /** Records `device` in the BMDB: a new machine with its Provided tag, or a refresh of the existing tag. */
  async #record(session: Session, device: EquinixDevice, how: string): Promise<EquinixMachine> {
    const facts = deviceFacts(device);
    let machineId: string | undefined;
    try {
      machineId = await session.transact(async (q) => {
        if (await updateProviderStatus(q, EQUINIX_PROVIDER, device.id, facts)) return undefined;
        const id = await newMachine(q);
        await addProvided(q, id, { provider: EQUINIX_PROVIDER, providerId: device.id, ...facts });
        return id;
      });
    } catch (error) {
      log.provider('device %s (%s) %s but not recorded: %s', device.id, device.hostname, how, describeError(error));
      throw new DeviceNotRecordedError(device.id, facts.providerReservationId, describeError(error), { cause: error });
    }
    if (machineId === undefined) {
      log.provider('device %s (%s) was already recorded; facts refreshed', device.id, device.hostname);
    } else {
      detail.provider('device %s (%s) %s, recorded as machine %s', device.id, device.hostname, how, machineId);
    }
    return deviceMachine(device, this.settings.devicePrefix, Availability.KnownUsed);
  }

  async #device(id: string, signal: AbortSignal | undefined): Promise<EquinixDevice> {
    try {
      return await this.#client.getDevice(id, signal);
    } catch (error) {
      throw notFound(error, id);
    }
  }
}

/** A 404 for a device as the shepherd's MachineNotFoundError; anything else unchanged. */
export function notFound(error: unknown, deviceId: string): unknown {
  return error instanceof EquinixApiError && error.status === 404
    ? new MachineNotFoundError(EQUINIX_PROVIDER, deviceId)
    : error;
}

function duration(name: string, value: number): number {
  if (!(value >= 0) || !Number.isFinite(value)) {
    throw new RangeError(`EquinixProvider: ${name} must be a duration >= 0 ms, got ${value}`);
  }
  return value;
}
