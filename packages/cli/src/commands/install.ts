import type { MachineNames, OSImage, OSImageCompression } from '@bmaas/bmdb-controlloop';
import { log } from '../logging.js';
import { type Argv, actor, fileContents, oneOf, optional, reason, UsageError } from '../settings.js';
import { withSession } from './hold.js';
import { describeMachine, MachinesNotDoneError, machineTargets, unknownLines } from './machine-targets.js';

/** The most user-data a request carries: cloud-init's own limit on most clouds is far lower. */
const MAX_USER_DATA = 64 * 1024;
const IMAGE_FLAGS = ['image-url', 'image-sha256', 'root-device', 'user-data'] as const;

/** What `install` is told, checked before anything is touched. */
type InstallSettings = {
  readonly targets: MachineNames;
  readonly reason: string;
  readonly actor: string;
} & ({ readonly cancel: false; readonly image: OSImage } | { readonly cancel: true });

/**
 * `shepherd install --provider P --provider-id ID… --image-url URL
 * --image-sha256 HEX --root-device DEV [--compression none|gzip]
 * [--user-data FILE] --reason TEXT` (or `--machine-id ID…`): requests an OS
 * installation of each machine, a new generation each; the machine's agent
 * gets it with its next heartbeat's answer (the initializer starts one
 * where none runs). `--cancel` withdraws the machines' requests instead.
 * Exits 1 for IDs the BMDB does not know and cancels refused, after doing
 * the others.
 */
export async function install(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings = await installSettings(argv);
  await withSession(argv, 'shepherd-install', async (session) => {
    const lookup = await session.transact((q) => q.lookUpMachines(settings.targets));
    const refused: string[] = [];
    for (const machine of lookup.found) {
      const name = describeMachine(machine);
      if (!settings.cancel) {
        const image = settings.image;
        const requested = await session.transact((q) =>
          q.requestOSInstallation(machine.machineId, { ...image, reason: settings.reason, actor: settings.actor }),
        );
        // A bigint: as a plain number (debug's %s writes one as `1n`).
        log('requested installation of %s, generation %s: %s', name, String(requested.generation), requested.imageUrl);
        write(
          `requested installation of ${name}: generation ${requested.generation}, ${requested.imageUrl} onto ${requested.rootDevice}\n`,
        );
        continue;
      }
      const result = await session.transact((q) =>
        q.cancelOSInstallation(machine.machineId, { reason: settings.reason, actor: settings.actor }),
      );
      if (result.canceled) {
        log('canceled the installation of %s, generation %s', name, String(result.installation?.generation));
        write(`canceled the installation of ${name}, generation ${result.installation?.generation}\n`);
      } else {
        refused.push(`${name}: ${result.cause}`);
      }
    }
    const notDone = [...refused, ...unknownLines(settings.targets, lookup)];
    if (notDone.length > 0) throw new MachinesNotDoneError(settings.cancel ? 'canceled none of' : 'refused', notDone);
  });
}

/** The flags, checked: each bad one named (exit 2) before the BMDB is opened. */
async function installSettings(argv: Argv): Promise<InstallSettings> {
  const targets = machineTargets(argv, 'install', { machineIds: true });
  if (argv.cancel === true) {
    const given = IMAGE_FLAGS.find((flag) => optional(argv, flag) !== undefined);
    if (given !== undefined) throw new UsageError(given, 'not with --cancel: a cancel withdraws the request as it is');
    return { targets, reason: reason(argv, 'install --cancel'), actor: actor(argv), cancel: true };
  }
  const imageUrl = need(argv, 'image-url');
  let url: URL | undefined;
  try {
    url = new URL(imageUrl);
  } catch {}
  if (url === undefined || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    throw UsageError.invalid('image-url', imageUrl, 'an http:// or https:// URL');
  }
  const imageSha256 = need(argv, 'image-sha256');
  if (!/^[0-9a-f]{64}$/i.test(imageSha256)) {
    throw UsageError.invalid('image-sha256', imageSha256, 'the image’s sha256, 64 hex digits');
  }
  const rootDevice = need(argv, 'root-device');
  if (!rootDevice.startsWith('/')) {
    throw UsageError.invalid('root-device', rootDevice, 'an absolute path of a block device, such as /dev/sda');
  }
  const compression: OSImageCompression = oneOf(argv, 'compression', ['none', 'gzip'] as const) ?? 'none';
  const userDataFile = optional(argv, 'user-data');
  const userData = userDataFile === undefined ? undefined : await fileContents('user-data', userDataFile);
  if (userData !== undefined && userData.length > MAX_USER_DATA) {
    throw new UsageError('user-data', `${JSON.stringify(userDataFile)} is larger than ${MAX_USER_DATA} bytes`);
  }
  const why = reason(argv, 'install');
  return {
    targets,
    reason: why,
    actor: actor(argv),
    cancel: false,
    image: { imageUrl, imageSha256: imageSha256.toLowerCase(), rootDevice, compression, userData },
  };
}

function need(argv: Argv, flag: string): string {
  const value = optional(argv, flag)?.trim();
  if (value === undefined || value === '') {
    throw new UsageError(flag, 'required for install (or withdraw a request with --cancel)');
  }
  return value;
}
