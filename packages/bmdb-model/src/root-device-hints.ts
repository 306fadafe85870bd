/**
 * Root-device hints as an OS installation request stores them: the install
 * disk named by what it is (Metal3's BareMetalHost `rootDeviceHints`), for the
 * agent to match against the disks it sees. The agent has its own parser of
 * the same shapes (it depends on no workspace package); the CLI's test runs
 * both on one table of cases to keep them in step.
 */
import { BMDBError } from '@bmaas/bmdb-controlloop';

/** The hints an installation request may carry; a disk matches when it matches every one given. */
export interface RootDeviceHints {
  /** /dev/sda, or a /dev/disk/by-path link. */
  readonly deviceName?: string;
  /** The model, case-insensitive. */
  readonly model?: string;
  /** The vendor, case-insensitive. */
  readonly vendor?: string;
  /** The serial number, exactly. */
  readonly serialNumber?: string;
  /** The World Wide Name: 0x and hex digits (the 0x may be left out). */
  readonly wwn?: string;
  /** The smallest disk to take, in GiB (2^30 bytes). */
  readonly minSizeGigabytes?: number;
  /** Only a rotational disk (true) or only a non-rotational one (false). */
  readonly rotational?: boolean;
}

/** The hint names, in Metal3's spelling. */
export const ROOT_DEVICE_HINT_FIELDS = [
  'deviceName',
  'model',
  'vendor',
  'serialNumber',
  'wwn',
  'minSizeGigabytes',
  'rotational',
] as const satisfies readonly (keyof RootDeviceHints)[];

/** Hints that are not a valid set of hints; `field` names the hint at fault. */
export class RootDeviceHintError extends BMDBError {
  override name = 'RootDeviceHintError';
  constructor(
    readonly field: string,
    /** What is wrong with it, without the request named (for a caller's own message). */
    readonly detail: string,
    what: string,
  ) {
    super(`${what}: root device hint ${field}: ${detail}`);
  }
}

/**
 * Checks `value` as hints and returns them with string values trimmed.
 *
 * @throws {@link RootDeviceHintError} for an unknown field, an empty or
 *   wrongly typed value, a WWN that is not hex, a device name not under /dev/,
 *   a minimum size that is not a positive whole number of GiB, or no hint at all
 */
export function checkRootDeviceHints(value: unknown, what: string): RootDeviceHints {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new RootDeviceHintError('(hints)', `want an object of hints, got ${JSON.stringify(value)}`, what);
  }
  const hints: Record<string, string | number | boolean> = {};
  for (const [field, given] of Object.entries(value)) {
    if (!(ROOT_DEVICE_HINT_FIELDS as readonly string[]).includes(field)) {
      throw new RootDeviceHintError(field, `unknown; the hints are ${ROOT_DEVICE_HINT_FIELDS.join(', ')}`, what);
    }
    if (field === 'rotational') {
      if (typeof given !== 'boolean') {
        throw new RootDeviceHintError(field, `want true or false, got ${JSON.stringify(given)}`, what);
      }
      hints[field] = given;
    } else if (field === 'minSizeGigabytes') {
      if (typeof given !== 'number' || !Number.isSafeInteger(given) || given <= 0) {
        throw new RootDeviceHintError(field, `want a positive whole number of GiB, got ${JSON.stringify(given)}`, what);
      }
      hints[field] = given;
    } else {
      if (typeof given !== 'string') {
        throw new RootDeviceHintError(field, `want a string, got ${JSON.stringify(given)}`, what);
      }
      if (given.trim() === '') throw new RootDeviceHintError(field, 'empty; leave the hint out instead', what);
      if (field === 'wwn' && !/^(0x)?[0-9a-fA-F]+$/.test(given.trim())) {
        throw new RootDeviceHintError(field, `${JSON.stringify(given)} is not 0x and hex digits`, what);
      }
      if (field === 'deviceName' && !given.startsWith('/dev/')) {
        throw new RootDeviceHintError(field, `${JSON.stringify(given)} is not a path under /dev/`, what);
      }
      hints[field] = given.trim();
    }
  }
  if (Object.keys(hints).length === 0) throw new RootDeviceHintError('(hints)', 'no hint given', what);
  return hints as RootDeviceHints;
}

/** Stored hints in the order of {@link ROOT_DEVICE_HINT_FIELDS}: jsonb keeps its own key order. */
export function inFieldOrder(hints: RootDeviceHints): RootDeviceHints {
  const ordered: Record<string, string | number | boolean> = {};
  for (const field of ROOT_DEVICE_HINT_FIELDS) {
    const value = hints[field];
    if (value !== undefined) ordered[field] = value;
  }
  return ordered as RootDeviceHints;
}
