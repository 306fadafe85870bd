/** OS installation requests: requested and canceled by operators, handed to agents, answered by their reports. */

import { BMDBError } from '@bmaas/bmdb-controlloop';
import { type Insertable, type Kysely, type Selectable, sql } from 'kysely';
import type { PendingOSInstallation } from '../agent-heartbeat-check.js';
import { checkHostname, checkNetworkConfig, checkSshPublicKey, isHostname, type NetworkConfig } from '../first-boot.js';
import { checkRootDeviceHints, inFieldOrder, type RootDeviceHints } from '../root-device-hints.js';
import {
  type Database,
  type MachineOsInstallationRequestTable,
  OperatorAction,
  OperatorOutcome,
  type OSImageCompression,
  OSInstallationState,
  OSRequestKind,
} from '../schema.js';
import { checkActor, checkReason, recordOperatorAction } from './operator-history.js';

/** The disk image an installation writes, as an operator asks for it. */
export interface OSImage {
  /** Where the agent downloads the image: an `http://` or `https://` URL. */
  readonly imageUrl: string;
  /** sha256 of the image's bytes as downloaded (before decompression): 64 hex digits. */
  readonly imageSha256: string;
  /**
   * The block device the image is written to, an absolute path (`/dev/sda`).
   * Give it, {@link OSImage.rootDeviceHints}, or both.
   */
  readonly rootDevice?: string | undefined;
  /** The block device named by what it is (serial, WWN, model, ...); the agent takes the one disk matching all. */
  readonly rootDeviceHints?: RootDeviceHints | undefined;
  /** How the image is compressed as downloaded. Default `none`. */
  readonly compression?: OSImageCompression | undefined;
  /** cloud-init user-data for the installed OS, if any. */
  readonly userData?: Uint8Array | undefined;
  /** The installed OS's hostname; the machine's provider ID unless given (its machine ID where that is no hostname). */
  readonly hostname?: string | undefined;
  /** OpenSSH public keys (`authorized_keys` lines) the installed OS lets in. */
  readonly sshPublicKeys?: readonly string[] | undefined;
  /** The installed OS's network (NICs by MAC, bonds, VLANs, static addresses); unset: DHCP on each NIC. */
  readonly network?: NetworkConfig | undefined;
}

/** An operator's installation request (see {@link requestOSInstallation}). */
export interface OSInstallationRequest extends OSImage {
  /** Who asks (`user@host`). */
  readonly actor: string;
  /** Why: recorded in the operator history. */
  readonly reason: string;
}

export type { PendingOSInstallation } from '../agent-heartbeat-check.js';

/** A machine's current OS installation request and where it stands. */
export interface OSInstallation extends PendingOSInstallation {
  readonly machineId: string;
  readonly state: OSInstallationState;
  readonly requestedAt: Date;
  readonly requestedBy: string;
  /** When the machine's agent first got it; null until then. */
  readonly deliveredAt: Date | null;
  /** When the agent's report was stored, or the request canceled. */
  readonly endedAt: Date | null;
  /** The agent's error, for `Failed`. */
  readonly error: string | null;
  /** A disk wipe `shepherd decommission --wipe` requested: the machine is removed once it succeeded. */
  readonly decommission: boolean;
  /** When the installed OS reported its first boot; null until it did. */
  readonly bootedAt: Date | null;
  /** The SSH host keys the installed OS sent with its first boot. */
  readonly bootedHostKeys: readonly string[];
  /**
   * Whether the installed OS came up, for a `Succeeded` disk image:
   * `booted` (it reported its first boot), `booting` (not yet, within
   * {@link FIRST_BOOT_BOUND_MINUTES} of the installation's end) or
   * `installed-not-booted` (not within it); undefined otherwise.
   */
  readonly firstBoot: FirstBoot | undefined;
}

/** Where a succeeded installation's OS stands: see {@link OSInstallation.firstBoot}. */
export type FirstBoot = 'booted' | 'booting' | 'installed-not-booted';

/**
 * How long after its installation's end the installed OS has to report its
 * first boot before it reads `installed-not-booted`: a server's firmware
 * and cloud-init's first run take minutes, not half an hour.
 */
export const FIRST_BOOT_BOUND_MINUTES = 30;

/** An operator's disk wipe request (see {@link requestDiskWipe}). */
export interface DiskWipeRequest {
  /** Who asks (`user@host`). */
  readonly actor: string;
  /** Why: recorded in the operator history. */
  readonly reason: string;
  /** The machine is to be removed from the BMDB once its disks were wiped. Default false. */
  readonly decommission?: boolean | undefined;
}

/** An installation with the machine's provider ID, for status lists. */
export interface ListedOSInstallation extends OSInstallation {
  readonly provider: string | null;
  readonly providerId: string | null;
}

/** Machines per installation state; machines never asked to install are in none. */
export type OSInstallationCounts = Readonly<Record<OSInstallationState, number>>;

/** What {@link cancelOSInstallation} did. */
export interface OSInstallationCancel {
  /** Whether a request was withdrawn (false: refused, see `cause`). */
  readonly canceled: boolean;
  /** The request after the call (`Canceled` if withdrawn); undefined when the machine has none. */
  readonly installation: OSInstallation | undefined;
  /** Why nothing was canceled. */
  readonly cause: string | undefined;
}

const SHA256 = /^[0-9a-f]{64}$/i;
const COMPRESSIONS: readonly string[] = ['none', 'gzip'];

/**
 * Refuses an image no agent could install, naming the bad field: a URL that
 * is not http(s), a sha256 that is not 64 hex digits, neither a root device
 * nor hints, a root device that is not an absolute path, a malformed hint
 * ({@link RootDeviceHintError}), an unknown compression. Returns the hints
 * as stored (trimmed).
 */
export function checkOSImage(image: OSImage, what: string): RootDeviceHints | undefined {
  let url: URL | undefined;
  try {
    url = new URL(image.imageUrl);
  } catch {}
  if (url === undefined || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    throw new BMDBError(`${what}: image URL ${JSON.stringify(image.imageUrl)} is not an http:// or https:// URL`);
  }
  if (typeof image.imageSha256 !== 'string' || !SHA256.test(image.imageSha256)) {
    throw new BMDBError(`${what}: image sha256 ${JSON.stringify(image.imageSha256)} is not 64 hex digits`);
  }
  if (image.rootDevice === undefined && image.rootDeviceHints === undefined) {
    throw new BMDBError(`${what}: neither a root device nor root device hints given`);
  }
  if (
    image.rootDevice !== undefined &&
    (typeof image.rootDevice !== 'string' || !image.rootDevice.startsWith('/') || /[\0\n]/.test(image.rootDevice))
  ) {
    throw new BMDBError(`${what}: root device ${JSON.stringify(image.rootDevice)} is not an absolute path`);
  }
  const hints = image.rootDeviceHints === undefined ? undefined : checkRootDeviceHints(image.rootDeviceHints, what);
  if (image.compression !== undefined && !COMPRESSIONS.includes(image.compression)) {
    throw new BMDBError(`${what}: compression ${JSON.stringify(image.compression)} is none of none, gzip`);
  }
  if (image.userData !== undefined && !(image.userData instanceof Uint8Array)) {
    throw new BMDBError(`${what}: user-data must be bytes`);
  }
  if (image.hostname !== undefined) checkHostname(image.hostname, what);
  if (image.sshPublicKeys !== undefined) {
    if (!Array.isArray(image.sshPublicKeys)) throw new BMDBError(`${what}: SSH public keys must be a list`);
    for (const key of image.sshPublicKeys) checkSshPublicKey(key, what);
  }
  if (image.network !== undefined) checkNetworkConfig(image.network, what);
  return hints;
}

/**
 * Requests an OS installation of the machine: the disk image is handed to
 * its agent with its next heartbeat's answer (the initializer starts an
 * agent where none runs, an installed machine included). Each request
 * gets the next generation, past every one requested or reported before,
 * and replaces the machine's request whatever its state (an installation
 * under way is told by its next heartbeat's answer). Records `InstallOS`
 * in the operator history with who, why and the image.
 *
 * @throws {@link BMDBError} for a machine not in the BMDB, without an actor
 *   or a reason, or for an image no agent could install (naming the field)
 */
export async function requestOSInstallation(
  db: Kysely<Database>,
  machineId: string,
  request: OSInstallationRequest,
): Promise<OSInstallation> {
  const what = `OS installation request for machine ${machineId}`;
  const hints = checkOSImage(request, what);
  checkActor(request.actor, what);
  checkReason(request.reason, what, 'why the machine is installed');
  const machine = await db
    .selectFrom('machines as m')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'm.machine_id')
    .select(['m.machine_id', 'mp.provider_id'])
    .where('m.machine_id', '=', machineId)
    .executeTakeFirst();
  if (machine === undefined) throw new BMDBError(`${what}: no such machine in the BMDB`);
  const providerId = machine.provider_id;
  const hostname = request.hostname ?? (providerId !== null && isHostname(providerId) ? providerId : machineId);
  const values = {
    request_kind: OSRequestKind.DiskImage,
    decommission: false,
    image_url: request.imageUrl,
    image_sha256: request.imageSha256.toLowerCase(),
    root_device: request.rootDevice ?? null,
    root_device_hints: hints === undefined ? null : JSON.stringify(hints),
    compression: request.compression ?? 'none',
    user_data: request.userData === undefined ? null : Buffer.from(request.userData),
    hostname,
    ssh_public_keys: (request.sshPublicKeys ?? []).map((key) => key.trim()),
    network: request.network === undefined ? null : JSON.stringify(checkNetworkConfig(request.network, what)),
    requested_by: request.actor,
  };
  const { installation, previous } = await putRequest(db, machineId, values);
  await recordOperatorAction(db, {
    machineId,
    action: OperatorAction.InstallOS,
    outcome: OperatorOutcome.Succeeded,
    actor: request.actor,
    reason: request.reason,
    detail: {
      generation: Number(installation.generation),
      imageUrl: installation.imageUrl,
      imageSha256: installation.imageSha256,
      rootDevice: installation.rootDevice,
      rootDeviceHints: installation.rootDeviceHints,
      compression: installation.compression,
      userDataBytes: installation.userData?.length ?? 0,
      hostname: installation.hostname,
      sshPublicKeys: installation.sshPublicKeys.length,
      network: installation.network === undefined ? 'DHCP' : 'given',
      ...(previous && { replaced: { generation: Number(previous.generation), state: previous.state } }),
    },
  });
  return installation;
}

/**
 * Requests a wipe of every disk of the machine (disk_wipe.proto): a request
 * of kind `DiskWipe` with the next generation, replacing the machine's
 * current request as {@link requestOSInstallation} does.
 */
export async function requestDiskWipe(
  db: Kysely<Database>,
  machineId: string,
  request: DiskWipeRequest,
): Promise<OSInstallation> {
  const what = `disk wipe request for machine ${machineId}`;
  checkActor(request.actor, what);
  checkReason(request.reason, what, 'why the disks are wiped');
  const machine = await db.selectFrom('machines').select('machine_id').where('machine_id', '=', machineId).execute();
  if (machine.length === 0) throw new BMDBError(`${what}: no such machine in the BMDB`);
  const { installation, previous } = await putRequest(db, machineId, {
    request_kind: OSRequestKind.DiskWipe,
    decommission: request.decommission === true,
    image_url: null,
    image_sha256: null,
    root_device: null,
    root_device_hints: null,
    compression: 'none',
    user_data: null,
    hostname: null,
    ssh_public_keys: [],
    network: null,
    requested_by: request.actor,
  });
  await recordOperatorAction(db, {
    machineId,
    action: OperatorAction.WipeDisks,
    outcome: OperatorOutcome.Succeeded,
    actor: request.actor,
    reason: request.reason,
    detail: {
      generation: Number(installation.generation),
      decommission: installation.decommission,
      ...(previous && { replaced: { generation: Number(previous.generation), state: previous.state } }),
    },
  });
  return installation;
}

/** The columns a request sets, whichever its kind. */
type RequestValues = Omit<
  Insertable<MachineOsInstallationRequestTable>,
  'machine_id' | 'generation' | 'requested_at' | 'installation_state' | 'provider' | 'provider_location'
>;

/** Puts the machine's request with the next generation; returns it and the one it replaced. */
async function putRequest(
  db: Kysely<Database>,
  machineId: string,
  values: RequestValues,
): Promise<{ installation: OSInstallation; previous: OSInstallation | undefined }> {
  // The next generation is past both the request's and any report's, so a
  // report the agent sent for an older request never passes for this one.
  // ON CONFLICT reads the row's latest version: concurrent requests each get
  // their own generation.
  const reported = sql<string>`coalesce((SELECT r.generation FROM machine_os_installation_report r
    WHERE r.machine_id = ${machineId}::uuid), 0)`;
  const previous = await osInstallation(db, machineId);
  const row = await db
    .insertInto('machine_os_installation_request')
    .values({ machine_id: machineId, generation: sql<string>`${reported} + 1`, ...values })
    .onConflict((oc) =>
      oc.column('machine_id').doUpdateSet({
        ...values,
        generation: sql<string>`greatest(machine_os_installation_request.generation, ${reported}) + 1`,
        requested_at: sql<Date>`now()`,
        installation_state: OSInstallationState.Requested,
        delivered_at: null,
        installation_ended_at: null,
        installation_error: null,
        boot_secret_sha256: null,
        booted_at: null,
        booted_host_keys: null,
      }),
    )
    .returningAll()
    .returning(bootOverdue)
    .executeTakeFirstOrThrow();
  return { installation: toOSInstallation(row), previous };
}

/**
 * Withdraws the machine's OS installation request (`Requested`,
 * `Delivered` or `Failed`): it is handed out no more, a report of it is
 * ignored, and the agent installing it learns so from its next
 * heartbeat's answer. A request that succeeded is not canceled (request
 * a new one). Records `CancelOSInstallation` in the operator history,
 * `Refused` with the cause when there was nothing to cancel.
 */
export async function cancelOSInstallation(
  db: Kysely<Database>,
  machineId: string,
  request: { readonly actor: string; readonly reason: string },
): Promise<OSInstallationCancel> {
  const what = `cancel of the OS installation of machine ${machineId}`;
  checkActor(request.actor, what);
  checkReason(request.reason, what, 'why the installation is withdrawn');
  const previous = await osInstallation(db, machineId);
  const row = await db
    .updateTable('machine_os_installation_request')
    .set({ installation_state: OSInstallationState.Canceled, installation_ended_at: sql<Date>`now()` })
    .where('machine_id', '=', machineId)
    .where('installation_state', 'in', [
      OSInstallationState.Requested,
      OSInstallationState.Delivered,
      OSInstallationState.Failed,
    ])
    .returningAll()
    .returning(bootOverdue)
    .executeTakeFirst();
  const canceled = row && toOSInstallation(row);
  // Nothing canceled: the request as read before says why.
  const installation = canceled ?? previous;
  const cause =
    canceled !== undefined
      ? undefined
      : installation === undefined
        ? 'no OS installation was ever requested for it'
        : installation.state === OSInstallationState.Succeeded
          ? `its installation of generation ${installation.generation} succeeded; request a new one instead`
          : `its installation of generation ${installation.generation} is canceled already`;
  await recordOperatorAction(db, {
    machineId,
    action: OperatorAction.CancelOSInstallation,
    outcome: canceled ? OperatorOutcome.Succeeded : OperatorOutcome.Refused,
    actor: request.actor,
    reason: request.reason,
    cause: cause ?? null,
    detail: installation && {
      generation: Number(installation.generation),
      imageUrl: installation.imageUrl,
      // What it was when canceled: a Delivered one may have been written in part.
      ...(canceled && previous && { was: previous.state }),
    },
  });
  return { canceled: canceled !== undefined, installation, cause };
}

/** The machine's current OS installation request and where it stands, if one was ever made. */
export async function osInstallation(db: Kysely<Database>, machineId: string): Promise<OSInstallation | undefined> {
  const row = await db
    .selectFrom('machine_os_installation_request')
    .selectAll()
    .select(bootOverdue)
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return row && toOSInstallation(row);
}

/** OS installation requests (of these states), most recently requested first, at most `limit` (default 100). */
export async function osInstallations(
  db: Kysely<Database>,
  options: { states?: readonly OSInstallationState[]; limit?: number } = {},
): Promise<ListedOSInstallation[]> {
  let query = db
    .selectFrom('machine_os_installation_request as q')
    .leftJoin('machine_provided as mp', 'mp.machine_id', 'q.machine_id')
    .selectAll('q')
    .select(['mp.provider', 'mp.provider_id'])
    .select(bootOverdue)
    .orderBy('q.requested_at', 'desc')
    .orderBy('q.machine_id')
    .limit(options.limit ?? 100);
  if (options.states !== undefined) {
    if (options.states.length === 0) return [];
    query = query.where('q.installation_state', 'in', options.states);
  }
  const rows = await query.execute();
  return rows.map((row) => ({ ...toOSInstallation(row), provider: row.provider, providerId: row.provider_id }));
}

/**
 * Machines per installation state. `Succeeded`, most of a serving fleet, is
 * the sum of `fleet_location_totals.installed` (kept by triggers); the other
 * states are each a range of `machine_os_installation_request_state_idx`.
 */
export async function osInstallationCounts(db: Kysely<Database>): Promise<OSInstallationCounts> {
  const { rows } = await sql<{ installation_state: OSInstallationState; count: number }>`
    SELECT installation_state, count(*)::int AS count FROM machine_os_installation_request
    WHERE installation_state IN ('Requested', 'Delivered', 'Failed', 'Canceled')
    GROUP BY installation_state
    UNION ALL
    SELECT 'Succeeded', coalesce(sum(installed), 0)::int FROM fleet_location_totals`.execute(db);
  const counts: Record<OSInstallationState, number> = { ...NO_INSTALLATIONS };
  for (const row of rows) counts[row.installation_state] = row.count;
  return counts;
}

const NO_INSTALLATIONS: Record<OSInstallationState, number> = {
  Requested: 0,
  Delivered: 0,
  Succeeded: 0,
  Failed: 0,
  Canceled: 0,
};

/**
 * Whether a succeeded installation's OS is past its bound without reporting
 * its first boot, by the database's clock (which tests move).
 */
const bootOverdue = sql<boolean>`(installation_state = 'Succeeded' AND booted_at IS NULL
  AND installation_ended_at < now() - make_interval(mins => ${FIRST_BOOT_BOUND_MINUTES}))`.as('boot_overdue');

export function toOSInstallation(
  row: Selectable<MachineOsInstallationRequestTable> & { readonly boot_overdue: boolean | null },
): OSInstallation {
  const succeeded =
    row.installation_state === OSInstallationState.Succeeded && row.request_kind === OSRequestKind.DiskImage;
  return {
    machineId: row.machine_id,
    generation: BigInt(row.generation),
    kind: row.request_kind,
    imageUrl: row.image_url ?? '',
    imageSha256: row.image_sha256 ?? '',
    rootDevice: row.root_device ?? undefined,
    rootDeviceHints: row.root_device_hints === null ? undefined : inFieldOrder(row.root_device_hints),
    compression: row.compression,
    userData: row.user_data ?? undefined,
    state: row.installation_state,
    requestedAt: row.requested_at,
    requestedBy: row.requested_by,
    deliveredAt: row.delivered_at,
    endedAt: row.installation_ended_at,
    error: row.installation_error,
    decommission: row.decommission,
    hostname: row.hostname ?? '',
    sshPublicKeys: row.ssh_public_keys,
    network: row.network ?? undefined,
    bootedAt: row.booted_at,
    bootedHostKeys: row.booted_host_keys ?? [],
    firstBoot: !succeeded
      ? undefined
      : row.booted_at !== null
        ? 'booted'
        : row.boot_overdue === true
          ? 'installed-not-booted'
          : 'booting',
  };
}
