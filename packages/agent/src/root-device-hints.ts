import type { DiskRecord } from './hardware/disks.js';

/**
 * Root-device hints: the install disk named by what it is, as Metal3's
 * BareMetalHost `rootDeviceHints` (and Ironic's `root_device`) do, because
 * /dev/sda on one boot can be another disk on the next. A disk matches when
 * it matches every hint given.
 */
export interface RootDeviceHints {
  /** /dev/sda, or a /dev/disk/by-path link. */
  readonly deviceName?: string;
  /** The model, case-insensitive. */
  readonly model?: string;
  /** The vendor, case-insensitive. */
  readonly vendor?: string;
  /** The serial number, exactly. */
  readonly serialNumber?: string;
  /** The World Wide Name: 0x and hex digits (the 0x may be left out; case-insensitive). */
  readonly wwn?: string;
  /** The smallest disk to take, in GiB (2^30 bytes). */
  readonly minSizeGigabytes?: number;
  /** Only a rotational disk (true) or only a non-rotational one (false). */
  readonly rotational?: boolean;
}

const HINT_FIELDS = [
  'deviceName',
  'model',
  'vendor',
  'serialNumber',
  'wwn',
  'minSizeGigabytes',
  'rotational',
] as const satisfies readonly (keyof RootDeviceHints)[];

/** Why a hints object was refused: `field` is the hint at fault. */
export type RootDeviceHintProblem =
  | 'unknown-field'
  | 'empty'
  | 'not-a-size'
  | 'not-a-wwn'
  | 'not-a-device-path'
  | 'not-a-string'
  | 'not-a-boolean'
  | 'not-an-object';

/** A hints object that is not a valid set of hints; names the field at fault. */
export class RootDeviceHintError extends Error {
  override name = 'RootDeviceHintError';
  constructor(
    readonly field: string,
    readonly problem: RootDeviceHintProblem,
    detail: string,
  ) {
    super(`root device hint ${field}: ${detail}`);
  }
}

/** No disk, or several, matched the hints; names the disks seen. */
export class RootDeviceNotFoundError extends Error {
  override name = 'RootDeviceNotFoundError';
  constructor(
    readonly hints: RootDeviceHints,
    readonly matched: readonly string[],
    readonly seen: readonly string[],
  ) {
    super(
      `root device hints ${JSON.stringify(hints)} matched ${
        matched.length === 0 ? 'no disk' : `${matched.length} disks (${matched.join(', ')})`
      }; disks seen: ${seen.length === 0 ? 'none' : seen.join('; ')}`,
    );
  }
}

/**
 * Checks an object (from JSON, or the request's hints) as hints.
 *
 * @throws {@link RootDeviceHintError} for an unknown field, an empty or
 *   wrongly typed value, or a minimum size that is not a positive whole
 *   number of GiB
 */
export function parseRootDeviceHints(value: unknown): RootDeviceHints {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new RootDeviceHintError('(hints)', 'not-an-object', `want an object of hints, got ${JSON.stringify(value)}`);
  }
  const hints: Record<string, string | number | boolean> = {};
  for (const [field, given] of Object.entries(value)) {
    if (!(HINT_FIELDS as readonly string[]).includes(field)) {
      throw new RootDeviceHintError(field, 'unknown-field', `unknown; the hints are ${HINT_FIELDS.join(', ')}`);
    }
    if (field === 'rotational') {
      if (typeof given !== 'boolean') {
        throw new RootDeviceHintError(field, 'not-a-boolean', `want true or false, got ${JSON.stringify(given)}`);
      }
      hints[field] = given;
    } else if (field === 'minSizeGigabytes') {
      if (typeof given !== 'number' || !Number.isSafeInteger(given) || given <= 0) {
        throw new RootDeviceHintError(
          field,
          'not-a-size',
          `want a positive whole number of GiB, got ${JSON.stringify(given)}`,
        );
      }
      hints[field] = given;
    } else {
      if (typeof given !== 'string') {
        throw new RootDeviceHintError(field, 'not-a-string', `want a string, got ${JSON.stringify(given)}`);
      }
      if (given.trim() === '') throw new RootDeviceHintError(field, 'empty', 'empty; leave the hint out instead');
      if (field === 'wwn' && !/^(0x)?[0-9a-fA-F]+$/.test(given.trim())) {
        throw new RootDeviceHintError(field, 'not-a-wwn', `${JSON.stringify(given)} is not 0x and hex digits`);
      }
      if (field === 'deviceName' && !given.startsWith('/dev/')) {
        throw new RootDeviceHintError(field, 'not-a-device-path', `${JSON.stringify(given)} is not a path under /dev/`);
      }
      hints[field] = given.trim();
    }
  }
  return hints as RootDeviceHints;
}

/** Whether `hints` has no hint at all. */
export function noHints(hints: RootDeviceHints): boolean {
  return HINT_FIELDS.every((field) => hints[field] === undefined);
}

/**
 * The one disk matching every hint.
 *
 * @throws {@link RootDeviceNotFoundError} when none matches, or several do
 */
export function chooseRootDevice(disks: readonly DiskRecord[], hints: RootDeviceHints): DiskRecord {
  const matching = disks.filter((disk) => matches(disk, hints));
  if (matching.length === 1) return matching[0] as DiskRecord;
  throw new RootDeviceNotFoundError(
    hints,
    matching.map((disk) => disk.path),
    disks.map(describeDisk),
  );
}

function matches(disk: DiskRecord, hints: RootDeviceHints): boolean {
  const same = (a: string, b: string) => a.trim().toLowerCase() === b.trim().toLowerCase();
  if (hints.deviceName !== undefined && disk.path !== hints.deviceName && !disk.byPath.includes(hints.deviceName)) {
    return false;
  }
  if (hints.model !== undefined && !same(disk.model, hints.model)) return false;
  if (hints.vendor !== undefined && !same(disk.vendor, hints.vendor)) return false;
  if (hints.serialNumber !== undefined && disk.serialNumber !== hints.serialNumber) return false;
  if (hints.wwn !== undefined && (disk.wwn === '' || !same(disk.wwn, normalWwn(hints.wwn)))) return false;
  if (hints.minSizeGigabytes !== undefined && disk.sizeBytes < hints.minSizeGigabytes * 2 ** 30) return false;
  if (hints.rotational !== undefined && disk.rotational !== hints.rotational) return false;
  return true;
}

function normalWwn(wwn: string): string {
  return wwn.toLowerCase().startsWith('0x') ? wwn : `0x${wwn}`;
}

function describeDisk(disk: DiskRecord): string {
  const parts = [
    disk.model && `model ${JSON.stringify(disk.model)}`,
    disk.serialNumber && `serial ${JSON.stringify(disk.serialNumber)}`,
    disk.wwn && `wwn ${disk.wwn}`,
    `${(disk.sizeBytes / 2 ** 30).toFixed(1)} GiB`,
    ...disk.byPath,
  ].filter(Boolean);
  return `${disk.path} (${parts.join(', ')})`;
}
