import {
  cancelOSInstallation,
  checkNetworkConfig,
  checkRootDeviceHints,
  checkSshPublicKey,
  FirstBootSettingError,
  isHostname,
  lookUpMachines,
  type MachineNames,
  type MachineRef,
  type NetworkConfig,
  type OSImage,
  type OSImageCompression,
  RootDeviceHintError,
  type RootDeviceHints,
  requestOSInstallation,
} from '@bmaas/bmdb-model';
import { InventoryError, type InventoryMachine, InventorySource } from '@bmaas/provider-static';
import { withSession } from '../database.js';
import { log } from '../logging.js';
import { type Argv, actor, fileContents, oneOf, optional, reason, UsageError } from '../settings.js';
import { describeMachine, MachinesNotDoneError, machineTargets, unknownLines } from './machine-targets.js';

/** The most user-data a request carries: cloud-init's own limit on most clouds is far lower. */
const MAX_USER_DATA = 64 * 1024;
/**
 * The flags a cancel refuses. Not `--inventory`: the settings file's
 * SHEPHERD_INVENTORY serves `run static` too, and a cancel does not read it.
 */
const IMAGE_FLAGS = [
  'image-url',
  'image-sha256',
  'root-device',
  'root-device-hint',
  'user-data',
  'hostname',
  'ssh-key',
  'network',
] as const;

/** What the installed OS is given on its first boot, as the flags say it; unset: the inventory's, else the defaults. */
interface FirstBootFlags {
  readonly hostname: string | undefined;
  readonly sshPublicKeys: readonly string[] | undefined;
  readonly network: NetworkConfig | undefined;
  /** The Static inventory's machines by ID, when --inventory was given. */
  readonly inventory: ReadonlyMap<string, InventoryMachine> | undefined;
}

/** What `install` is told, checked before anything is touched. */
type InstallSettings = {
  readonly targets: MachineNames;
  readonly reason: string;
  readonly actor: string;
} & (
  | { readonly cancel: false; readonly image: OSImage; readonly firstBoot: FirstBootFlags }
  | { readonly cancel: true }
);

/**
 * `shepherd install --provider P --provider-id ID… --image-url URL
 * --image-sha256 HEX (--root-device DEV | --root-device-hint FIELD=VALUE…)
 * [--compression none|gzip]
 * [--user-data FILE] [--hostname NAME] [--ssh-key FILE…] [--network FILE]
 * [--inventory FILE|URL] --reason TEXT` (or `--machine-id ID…`): requests an OS
 * installation of each machine, a new generation each; the machine's agent
 * gets it with its next heartbeat's answer (the initializer starts one
 * where none runs). `--cancel` withdraws the machines' requests instead.
 * Exits 1 for IDs the BMDB does not know and cancels refused, after doing
 * the others.
 */
export async function install(argv: Argv, write: (text: string) => void): Promise<void> {
  const settings = await installSettings(argv);
  await withSession(argv, 'shepherd-install', async (session) => {
    const lookup = await session.transact((q) => lookUpMachines(q, settings.targets));
    const refused: string[] = [];
    for (const machine of lookup.found) {
      const name = describeMachine(machine);
      if (!settings.cancel) {
        const image = { ...settings.image, ...firstBootOf(machine, settings.firstBoot) };
        const requested = await session.transact((q) =>
          requestOSInstallation(q, machine.machineId, { ...image, reason: settings.reason, actor: settings.actor }),
        );
        // A bigint: as a plain number (debug's %s writes one as `1n`).
        log('requested installation of %s, generation %s: %s', name, String(requested.generation), requested.imageUrl);
        write(
          `requested installation of ${name}: generation ${requested.generation}, ${requested.imageUrl} onto ${describeRootDevice(requested.rootDevice, requested.rootDeviceHints)}\n`,
        );
        continue;
      }
      const result = await session.transact((q) =>
        cancelOSInstallation(q, machine.machineId, { reason: settings.reason, actor: settings.actor }),
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
  const rootDevice = optional(argv, 'root-device')?.trim() || undefined;
  const rootDeviceHints = hintsOf(argv);
  if (rootDevice === undefined && rootDeviceHints === undefined) {
    throw new UsageError(
      'root-device',
      'required for install, or --root-device-hint (or withdraw a request with --cancel)',
    );
  }
  if (rootDevice !== undefined && !rootDevice.startsWith('/')) {
    throw UsageError.invalid('root-device', rootDevice, 'an absolute path of a block device, such as /dev/sda');
  }
  const compression: OSImageCompression = oneOf(argv, 'compression', ['none', 'gzip'] as const) ?? 'none';
  const userDataFile = optional(argv, 'user-data');
  const userData = userDataFile === undefined ? undefined : await fileContents('user-data', userDataFile);
  if (userData !== undefined && userData.length > MAX_USER_DATA) {
    throw new UsageError('user-data', `${JSON.stringify(userDataFile)} is larger than ${MAX_USER_DATA} bytes`);
  }
  const firstBoot = await firstBootFlags(argv, targets);
  const why = reason(argv, 'install');
  return {
    targets,
    reason: why,
    actor: actor(argv),
    cancel: false,
    image: { imageUrl, imageSha256: imageSha256.toLowerCase(), rootDevice, rootDeviceHints, compression, userData },
    firstBoot,
  };
}

/**
 * `--hostname`, `--ssh-key FILE…`, `--network FILE` and `--inventory`, each
 * checked by the library's rules (a bad one exits 2 naming it). A hostname
 * or a network names one machine's, so either is refused for several.
 */
async function firstBootFlags(argv: Argv, targets: MachineNames): Promise<FirstBootFlags> {
  const several = ('machineIds' in targets ? targets.machineIds : targets.providerIds).length > 1;
  const hostname = optional(argv, 'hostname')?.trim();
  if (hostname !== undefined && !isHostname(hostname)) {
    throw UsageError.invalid('hostname', hostname, 'a hostname: letters, digits and hyphens, dots between');
  }
  const networkFile = optional(argv, 'network');
  for (const [flag, given] of [
    ['hostname', hostname],
    ['network', networkFile],
  ] as const) {
    if (given !== undefined && several) throw new UsageError(flag, 'names one machine’s: install one machine with it');
  }
  let network: NetworkConfig | undefined;
  if (networkFile !== undefined) {
    const text = (await fileContents('network', networkFile)).toString('utf8');
    try {
      network = checkNetworkConfig(JSON.parse(text), 'install');
    } catch (error) {
      if (error instanceof SyntaxError)
        throw new UsageError(
          'network',
          `${JSON.stringify(networkFile)} is not JSON (${error.message.replaceAll('\n', '\\n')})`,
        );
      if (error instanceof FirstBootSettingError)
        throw new UsageError('network', `${JSON.stringify(networkFile)}: ${error.detail}`);
      throw error;
    }
  }
  const raw = argv['ssh-key'];
  const keyFiles = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw]).map(String);
  const sshPublicKeys: string[] = [];
  for (const file of keyFiles) {
    const lines = (await fileContents('ssh-key', file)).toString('utf8').split('\n');
    for (const line of lines.map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'))) {
      try {
        sshPublicKeys.push(checkSshPublicKey(line, 'install'));
      } catch (error) {
        if (error instanceof FirstBootSettingError)
          throw new UsageError('ssh-key', `${JSON.stringify(file)}: ${error.detail}`);
        throw error;
      }
    }
  }
  const location = optional(argv, 'inventory');
  let inventory: Map<string, InventoryMachine> | undefined;
  if (location !== undefined) {
    try {
      inventory = new Map((await new InventorySource(location).read()).map((machine) => [machine.id, machine]));
    } catch (error) {
      if (error instanceof InventoryError) throw new UsageError('inventory', error.message);
      throw error;
    }
  }
  return { hostname, sshPublicKeys: keyFiles.length > 0 ? sshPublicKeys : undefined, network, inventory };
}

/** One machine's first-boot settings: the flags', else its Static inventory entry's; what neither gives, the library's defaults. */
function firstBootOf(
  machine: MachineRef,
  flags: FirstBootFlags,
): Pick<OSImage, 'hostname' | 'sshPublicKeys' | 'network'> {
  const entry =
    machine.provider === 'Static' && machine.providerId ? flags.inventory?.get(machine.providerId) : undefined;
  return {
    hostname: flags.hostname ?? entry?.hostname,
    sshPublicKeys: flags.sshPublicKeys ?? entry?.sshPublicKeys,
    network: flags.network ?? entry?.network,
  };
}

function need(argv: Argv, flag: string): string {
  const value = optional(argv, flag)?.trim();
  if (value === undefined || value === '') {
    throw new UsageError(flag, 'required for install (or withdraw a request with --cancel)');
  }
  return value;
}

/**
 * `--root-device-hint FIELD=VALUE…` as hints, checked by the library's rules;
 * undefined when none is given. minSizeGigabytes is read as a number and
 * rotational as true or false, so "100GB" or "yes" is refused here.
 */
function hintsOf(argv: Argv): RootDeviceHints | undefined {
  const raw = argv['root-device-hint'];
  const given = (Array.isArray(raw) ? raw : raw === undefined ? [] : [raw]).map(String);
  if (given.length === 0) return undefined;
  const hints: Record<string, string | number | boolean> = {};
  for (const hint of given) {
    const equals = hint.indexOf('=');
    if (equals <= 0) throw UsageError.invalid('root-device-hint', hint, 'FIELD=VALUE, such as serialNumber=S3Z1NX0K');
    const field = hint.slice(0, equals).trim();
    const value = hint.slice(equals + 1);
    if (field in hints) throw UsageError.invalid('root-device-hint', hint, `${field} once`);
    hints[field] =
      field === 'minSizeGigabytes' && /^\s*\d+\s*$/.test(value)
        ? Number(value)
        : field === 'rotational' && (value === 'true' || value === 'false')
          ? value === 'true'
          : value;
  }
  try {
    return checkRootDeviceHints(hints, 'install');
  } catch (error) {
    if (!(error instanceof RootDeviceHintError)) throw error;
    const bad = given.find((hint) => hint.slice(0, hint.indexOf('=')).trim() === error.field) ?? given.join(' ');
    throw UsageError.invalid('root-device-hint', bad, `root device hint ${error.field}: ${error.detail}`);
  }
}

/** `/dev/sda`, `serialNumber=S3Z1NX0K`, or both. */
export function describeRootDevice(rootDevice: string | undefined, hints: RootDeviceHints | undefined): string {
  const named = Object.entries(hints ?? {}).map(([field, value]) => `${field}=${value}`);
  return [...(rootDevice === undefined ? [] : [rootDevice]), ...named].join(' ');
}
