/**
 * Root-device hints as an OS installation request stores them: the install
 * disk named by what it is (Metal3's BareMetalHost `rootDeviceHints`), for the
 * agent to match against the disks it sees. The shape and the parser are the
 * agent's too (`@bmaas/api/root-device-hints`); here they are checked before
 * they are stored, with the request named.
 */
import {
  RootDeviceHintError as HintParseError,
  noHints,
  parseRootDeviceHints,
  ROOT_DEVICE_HINT_FIELDS,
  type RootDeviceHints,
} from '@bmaas/api/root-device-hints';
import { BMDBError } from '@bmaas/bmdb-controlloop';

export { ROOT_DEVICE_HINT_FIELDS, type RootDeviceHints };

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
  let hints: RootDeviceHints;
  try {
    hints = parseRootDeviceHints(value);
  } catch (error) {
    if (error instanceof HintParseError) throw new RootDeviceHintError(error.field, error.detail, what);
    throw error;
  }
  if (noHints(hints)) throw new RootDeviceHintError('(hints)', 'no hint given', what);
  return hints;
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
