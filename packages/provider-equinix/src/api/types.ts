/**
 * The Equinix Metal API's JSON shapes, as far as the shepherd reads them.
 * Field names are the API's own (snake_case); fields the shepherd does not
 * use are left out, and the API may send more.
 */

/**
 * A reference to another object. The API sends an `href` (and, with
 * `include=`, the whole object, which has an `id`).
 */
export interface EquinixRef {
  readonly id?: string;
  readonly href?: string;
}

/** Device states documented by the API; others may appear. */
export type DeviceState =
  | 'queued'
  | 'provisioning'
  | 'post_provisioning'
  | 'active'
  | 'inactive'
  | 'powering_on'
  | 'powering_off'
  | 'reinstalling'
  | 'failed'
  | 'deleted';

export interface EquinixIpAddress {
  readonly address: string;
  readonly public: boolean;
  /** 4 or 6. */
  readonly address_family: number;
  readonly management?: boolean;
}

/** `GET /devices/{id}`, an element of `GET /projects/{id}/devices`. */
export interface EquinixDevice {
  readonly id: string;
  readonly hostname: string;
  readonly state: DeviceState | (string & {});
  readonly tags?: readonly string[];
  readonly ip_addresses?: readonly EquinixIpAddress[];
  readonly hardware_reservation?: EquinixRef | null;
  readonly facility?: { readonly code: string } | null;
  readonly metro?: { readonly code: string } | null;
  readonly plan?: { readonly slug: string } | null;
}

/** An element of `GET /projects/{id}/hardware-reservations`. */
export interface EquinixHardwareReservation {
  readonly id: string;
  /** The reservation can take a new device right now. */
  readonly provisionable: boolean;
  /** The device currently on the reservation, if any. */
  readonly device?: EquinixRef | null;
  readonly plan: { readonly slug: string };
  readonly facility?: { readonly code: string } | null;
}

/** A project SSH key (`GET /projects/{id}/ssh-keys`). */
export interface EquinixSshKey {
  readonly id: string;
  readonly label: string;
  /** The public key in authorized_keys form. */
  readonly key: string;
  readonly fingerprint?: string;
}

/** Body of `POST /projects/{id}/devices`. */
export interface DeviceCreateRequest {
  readonly hostname: string;
  readonly plan: string;
  readonly operating_system: string;
  readonly hardware_reservation_id?: string;
  /** Project SSH key IDs to install; omitted, the API installs every project and user key. */
  readonly project_ssh_keys?: readonly string[];
  readonly tags?: readonly string[];
}

/** Pagination block of list responses. */
export interface EquinixMeta {
  readonly next?: { readonly href?: string } | null;
  readonly last_page?: number;
  readonly current_page?: number;
  readonly total?: number;
}

/** The ID a reference points at: its `id`, else the last segment of its `href`. */
export function refId(ref: EquinixRef | null | undefined): string | undefined {
  if (!ref) return undefined;
  if (typeof ref.id === 'string' && ref.id !== '') return ref.id;
  if (typeof ref.href !== 'string') return undefined;
  const last = ref.href.split('?')[0]?.split('/').filter(Boolean).pop();
  return last === undefined || last === '' ? undefined : last;
}
