/**
 * Root-device hints: an OS installation's install disk named by what it is,
 * as Metal3's BareMetalHost `rootDeviceHints` (and Ironic's `root_device`) do,
 * because /dev/sda on one boot can be another disk on the next. The shepherd
 * checks an operator's before it stores them; the agent checks them again as
 * the request carries them (`DiskImageInstallationRequest.root_device_hints`
 * in `proto/cloud/agent/api/disk_image.proto`) and matches them against the
 * disks it sees. One parser, so the two never disagree. Written by hand.
 */

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
  /** The World Wide Name: 0x and hex digits (the 0x may be left out; case-insensitive). */
  readonly wwn?: string;
  /** The smallest disk to take, in GiB (2^30 bytes). */
  readonly minSizeGigabytes?: number;
  /** Only a rotational disk (true) or only a non-rotational one (false). */
  readonly rotational?: boolean;
}

/** The hint names, in Metal3's spelling and order. */
export const ROOT_DEVICE_HINT_FIELDS = [
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
    /** What is wrong with it, without the request named (for a caller's own message). */
    readonly detail: string,
  ) {
    super(`root device hint ${field}: ${detail}`);
  }
}

/**
 * Checks an object (from JSON, or a request's hints) as hints and returns
 * them with string values trimmed. No hint at all is valid here (see
 * {@link noHints}): whether that is allowed is the caller's to say.
 *
 * @throws {@link RootDeviceHintError} for an unknown field, an empty or
 *   wrongly typed value, a WWN that is not hex, a device name not under /dev/,
 *   or a minimum size that is not a positive whole number of GiB
 */
export function parseRootDeviceHints(value: unknown): RootDeviceHints {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new RootDeviceHintError('(hints)', 'not-an-object', `want an object of hints, got ${JSON.stringify(value)}`);
  }
  const hints: Record<string, string | number | boolean> = {};
  for (const [field, given] of Object.entries(value)) {
    if (!(ROOT_DEVICE_HINT_FIELDS as readonly string[]).includes(field)) {
      throw new RootDeviceHintError(
        field,
        'unknown-field',
        `unknown; the hints are ${ROOT_DEVICE_HINT_FIELDS.join(', ')}`,
      );
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
  return ROOT_DEVICE_HINT_FIELDS.every((field) => hints[field] === undefined);
}
