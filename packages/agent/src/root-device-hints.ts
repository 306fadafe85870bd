import type { RootDeviceHints } from '@bmaas/api/root-device-hints';
import type { DiskRecord } from './hardware/disks.js';

// The hints' shape and parser are the shepherd's and the agent's one copy (@bmaas/api/root-device-hints);
// this module matches them against the disks the agent sees.
export {
  noHints,
  parseRootDeviceHints,
  RootDeviceHintError,
  type RootDeviceHintProblem,
  type RootDeviceHints,
} from '@bmaas/api/root-device-hints';

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
