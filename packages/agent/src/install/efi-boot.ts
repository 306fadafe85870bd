import { open, readdir, readFile, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { InstallationError } from './errors.js';
import { ESP_TYPE, type GptPartition, readGpt } from './gpt.js';

/** The vendor GUID of the UEFI global variables (Boot####, BootOrder). */
export const EFI_GLOBAL_VARIABLE = '8be4df61-93ca-11d2-aa0d-00e098032b8c';

/** Non-volatile, boot-service and runtime access: what Boot#### and BootOrder are stored with. */
const VARIABLE_ATTRIBUTES = 0x07;

/** LOAD_OPTION_ACTIVE: the firmware may boot the entry. */
const LOAD_OPTION_ACTIVE = 0x01;

/** The removable-media path of the x86-64 boot loader, which every installed image's ESP has. */
export const DEFAULT_LOADER = '\\EFI\\BOOT\\BOOTX64.EFI';

/** A boot entry: an EFI_LOAD_OPTION (UEFI 2.10, 3.1.3) starting a loader from a GPT partition. */
export interface LoadOption {
  /** Shown in the firmware's boot menu. */
  readonly description: string;
  /** The EFI system partition holding the loader. */
  readonly partition: Pick<GptPartition, 'number' | 'uniqueGuid' | 'firstLba' | 'lastLba'>;
  /** The loader's path on it, with backslashes. */
  readonly loader: string;
}

/**
 * The EFI_LOAD_OPTION encoding of `option`: attributes (active), the device
 * path's length, the description (UCS-2, NUL-terminated), and the device
 * path: a hard drive media node (the GPT partition), a file path media node
 * (the loader) and the end node.
 */
export function encodeLoadOption(option: LoadOption): Uint8Array {
  const devicePath = Buffer.concat([hardDriveNode(option.partition), filePathNode(option.loader), END_NODE]);
  const head = Buffer.alloc(6);
  head.writeUInt32LE(LOAD_OPTION_ACTIVE, 0);
  head.writeUInt16LE(devicePath.length, 4);
  return Uint8Array.from(Buffer.concat([head, ucs2(option.description), devicePath]));
}

/** Media device path, Hard Drive (type 4, subtype 1, 42 bytes), GPT partition with a GUID signature. */
function hardDriveNode(partition: LoadOption['partition']): Buffer {
  const node = Buffer.alloc(42);
  node.writeUInt8(0x04, 0);
  node.writeUInt8(0x01, 1);
  node.writeUInt16LE(42, 2);
  node.writeUInt32LE(partition.number, 4);
  node.writeBigUInt64LE(partition.firstLba, 8);
  node.writeBigUInt64LE(partition.lastLba - partition.firstLba + 1n, 16);
  Buffer.from(partition.uniqueGuid).copy(node, 24);
  node.writeUInt8(0x02, 40); // partition format: GPT
  node.writeUInt8(0x02, 41); // signature type: GUID
  return node;
}

/** Media device path, File Path (type 4, subtype 4): the path in UCS-2, NUL-terminated. */
function filePathNode(loader: string): Buffer {
  const name = ucs2(loader);
  const node = Buffer.alloc(4);
  node.writeUInt8(0x04, 0);
  node.writeUInt8(0x04, 1);
  node.writeUInt16LE(4 + name.length, 2);
  return Buffer.concat([node, name]);
}

/** End of Hardware Device Path, End Entire Device Path. */
const END_NODE = Buffer.from([0x7f, 0xff, 0x04, 0x00]);

function ucs2(text: string): Buffer {
  return Buffer.concat([Buffer.from(text, 'utf16le'), Buffer.alloc(2)]);
}

function variableFile(efivars: string, name: string): string {
  return path.join(efivars, `${name}-${EFI_GLOBAL_VARIABLE}`);
}

/**
 * Adds `option` as a new Boot#### variable in efivarfs (mounted at
 * `efivars`: /sys/firmware/efi/efivars) and puts it first in BootOrder,
 * keeping the entries already there after it (so a machine whose disk
 * fails to boot still falls back to the network). Returns the entry's
 * number. Each variable is written as efivarfs wants it: its attributes,
 * then its data, in one write.
 */
export async function addBootEntry(efivars: string, option: LoadOption): Promise<number> {
  const taken = new Set<number>();
  for (const name of await readdir(efivars)) {
    const match = /^Boot([0-9A-F]{4})-/.exec(name);
    if (match && name.endsWith(EFI_GLOBAL_VARIABLE)) taken.add(Number.parseInt(match[1] as string, 16));
  }
  let number = 0;
  while (taken.has(number)) number++;
  if (number > 0xffff) throw new InstallationError('boot-entry', `no free Boot#### variable in ${efivars}`);
  const name = `Boot${number.toString(16).toUpperCase().padStart(4, '0')}`;
  await writeVariable(efivars, name, encodeLoadOption(option));
  const order = await bootOrder(efivars);
  const next = Buffer.alloc(2 * (order.filter((n) => n !== number).length + 1));
  [number, ...order.filter((n) => n !== number)].forEach((n, i) => {
    next.writeUInt16LE(n, 2 * i);
  });
  await writeVariable(efivars, 'BootOrder', next);
  return number;
}

/**
 * Removes every Boot#### entry whose description starts with `description`
 * (those earlier installations added) and drops them from BootOrder, so that
 * none names an ESP the coming write replaces. Returns their numbers.
 *
 * @throws {@link InstallationError} (`boot-entry`) when efivarfs refuses a removal
 */
export async function removeInstalledOsEntries(efivars: string, description: string): Promise<number[]> {
  const removed: number[] = [];
  for (const name of await readdir(efivars)) {
    const match = /^Boot([0-9A-F]{4})-/.exec(name);
    if (!match || !name.endsWith(EFI_GLOBAL_VARIABLE)) continue;
    const contents = await readFile(path.join(efivars, name)).catch(() => undefined);
    if (contents === undefined || !loadOptionDescription(contents.subarray(4)).startsWith(description)) continue;
    try {
      await unlink(path.join(efivars, name));
    } catch (error) {
      throw new InstallationError(
        'boot-entry',
        `removing the earlier boot entry ${name} from ${efivars} failed: ${(error as Error).message}`,
        { cause: error },
      );
    }
    removed.push(Number.parseInt(match[1] as string, 16));
  }
  if (removed.length === 0) return removed;
  const order = (await bootOrder(efivars)).filter((n) => !removed.includes(n));
  if (order.length === 0) {
    await unlink(variableFile(efivars, 'BootOrder')).catch(() => {});
    return removed.sort((a, b) => a - b);
  }
  const next = Buffer.alloc(2 * order.length);
  order.forEach((n, i) => {
    next.writeUInt16LE(n, 2 * i);
  });
  await writeVariable(efivars, 'BootOrder', next);
  return removed.sort((a, b) => a - b);
}

/** The description of an EFI_LOAD_OPTION: UCS-2 after its attributes and path length, up to its NUL. */
export function loadOptionDescription(option: Uint8Array): string {
  const bytes = Buffer.from(option.buffer, option.byteOffset, option.byteLength);
  let end = 6;
  while (end + 1 < bytes.length && (bytes[end] !== 0 || bytes[end + 1] !== 0)) end += 2;
  return bytes.toString('utf16le', 6, end);
}

/** BootOrder's entries, or none when it is not set. */
export async function bootOrder(efivars: string): Promise<number[]> {
  let contents: Buffer;
  try {
    contents = await readFile(variableFile(efivars, 'BootOrder'));
  } catch {
    return [];
  }
  const order: number[] = [];
  for (let at = 4; at + 2 <= contents.length; at += 2) order.push(contents.readUInt16LE(at));
  return order;
}

async function writeVariable(efivars: string, name: string, data: Uint8Array): Promise<void> {
  const contents = Buffer.alloc(4 + data.length);
  contents.writeUInt32LE(VARIABLE_ATTRIBUTES, 0);
  Buffer.from(data).copy(contents, 4);
  try {
    await writeFile(variableFile(efivars, name), contents);
  } catch (error) {
    throw new InstallationError(
      'boot-entry',
      `writing EFI variable ${name} in ${efivars} failed: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
}

/**
 * Makes the firmware boot the image just written to `device`: finds its EFI
 * system partition in its GPT and adds a boot entry for its default loader,
 * first in BootOrder, as upstream does after an installation.
 *
 * @throws {@link InstallationError} (`boot-entry`) when the image has no GPT
 *   or no EFI system partition, or efivarfs refuses the write
 */
export async function addBootEntryForDisk(
  efivars: string,
  device: string,
  logicalBlockSize: number,
  description: string,
): Promise<number> {
  const handle = await open(device, 'r');
  let partitions: GptPartition[];
  try {
    partitions = await readGpt(handle, logicalBlockSize, device);
  } catch (error) {
    throw new InstallationError('boot-entry', `no boot entry for ${device}: ${(error as Error).message}`, {
      cause: error,
    });
  } finally {
    await handle.close();
  }
  const esp = partitions.find((partition) => partition.type === ESP_TYPE);
  if (!esp) {
    throw new InstallationError('boot-entry', `no boot entry for ${device}: its GPT has no EFI system partition`);
  }
  return addBootEntry(efivars, { description, partition: esp, loader: DEFAULT_LOADER });
}
