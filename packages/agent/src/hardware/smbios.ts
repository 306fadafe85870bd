/**
 * The SMBIOS structure table (DMTF DSP0134), as Linux exposes it in
 * /sys/firmware/dmi/tables/DMI: structures one after another, each a
 * formatted area (type, length, handle, then type-specific fields) followed
 * by its strings, NUL-terminated, the set ending in a second NUL. Only what
 * the hardware report needs is read: BIOS information (type 0), system
 * information (type 1) and memory devices (type 17).
 */

/** One structure: its formatted area (header included) and its strings, numbered from 1. */
export interface SmbiosStructure {
  readonly type: number;
  readonly handle: number;
  readonly formatted: Uint8Array;
  readonly strings: readonly string[];
}

/** The table could not be read as SMBIOS structures. */
export class SmbiosError extends Error {
  override name = 'SmbiosError';
}

const END_OF_TABLE = 127;

/** Splits a table into its structures, up to the end-of-table structure (type 127) or the table's end. */
export function parseSmbiosTable(table: Uint8Array): SmbiosStructure[] {
  const structures: SmbiosStructure[] = [];
  let offset = 0;
  while (offset + 4 <= table.length) {
    const type = table[offset] as number;
    const length = table[offset + 1] as number;
    if (length < 4 || offset + length > table.length) {
      throw new SmbiosError(`SMBIOS structure of type ${type} at byte ${offset} has length ${length}, past the table`);
    }
    const formatted = table.subarray(offset, offset + length);
    const handle = (table[offset + 2] as number) | ((table[offset + 3] as number) << 8);
    const strings: string[] = [];
    let cursor = offset + length;
    // An empty string set is two NULs; otherwise each string ends in a NUL and the set in one more.
    if (table[cursor] === 0 && table[cursor + 1] === 0) cursor += 2;
    else {
      while (cursor < table.length && table[cursor] !== 0) {
        const end = table.indexOf(0, cursor);
        if (end < 0) throw new SmbiosError(`SMBIOS structure of type ${type} at byte ${offset}: unterminated string`);
        strings.push(Buffer.from(table.subarray(cursor, end)).toString('latin1').trim());
        cursor = end + 1;
      }
      cursor += 1;
    }
    structures.push({ type, handle, formatted, strings });
    offset = cursor;
    if (type === END_OF_TABLE) break;
  }
  return structures;
}

/** String number `index` (1-based, 0 for none) of a structure, or '' for none. */
function stringAt(structure: SmbiosStructure, fieldOffset: number): string {
  const index = structure.formatted[fieldOffset];
  if (index === undefined || index === 0) return '';
  return structure.strings[index - 1] ?? '';
}

function word(structure: SmbiosStructure, fieldOffset: number): number | undefined {
  const { formatted } = structure;
  if (fieldOffset + 2 > formatted.length) return undefined;
  return (formatted[fieldOffset] as number) | ((formatted[fieldOffset + 1] as number) << 8);
}

function dword(structure: SmbiosStructure, fieldOffset: number): number | undefined {
  const { formatted } = structure;
  if (fieldOffset + 4 > formatted.length) return undefined;
  return Buffer.from(formatted).readUInt32LE(fieldOffset);
}

/** System information (type 1): who made the machine, what it is, its serial number. */
export interface SmbiosSystem {
  readonly manufacturer: string;
  readonly product: string;
  readonly serialNumber: string;
}

export function smbiosSystem(structures: readonly SmbiosStructure[]): SmbiosSystem | undefined {
  const system = structures.find((s) => s.type === 1);
  if (!system) return undefined;
  return {
    manufacturer: stringAt(system, 0x04),
    product: stringAt(system, 0x05),
    serialNumber: stringAt(system, 0x07),
  };
}

/**
 * Whether the firmware says it supports UEFI (type 0, BIOS Characteristics
 * Extension Byte 2, bit 3; SMBIOS 2.2 and later); undefined when the table
 * does not say.
 */
export function smbiosUefiSupported(structures: readonly SmbiosStructure[]): boolean | undefined {
  const bios = structures.find((s) => s.type === 0);
  const byte2 = bios?.formatted[0x13];
  if (bios === undefined || bios.formatted.length < 0x14 || byte2 === undefined) return undefined;
  return (byte2 & 0x08) !== 0;
}

/** Memory technology (type 17, offset 0x28, SMBIOS 3.2): 0x03 is DRAM. */
const DRAM = 0x03;

/**
 * The bytes of each installed memory module (type 17 structures with a
 * module present and of known size; from SMBIOS 3.2, DRAM only, as
 * upstream: NVDIMMs and Optane are not memory the OS runs in).
 */
export function smbiosMemoryModules(structures: readonly SmbiosStructure[]): number[] {
  const sizes: number[] = [];
  for (const device of structures) {
    if (device.type !== 17) continue;
    const technology = device.formatted.length > 0x28 ? device.formatted[0x28] : undefined;
    if (technology !== undefined && technology !== DRAM) continue;
    const size = word(device, 0x0c);
    if (size === undefined || size === 0 || size === 0xffff) continue;
    if (size === 0x7fff) {
      // The size is in Extended Size (offset 0x1C), in MiB, bits 0-30.
      const extended = dword(device, 0x1c);
      if (extended !== undefined) sizes.push((extended & 0x7fffffff) * 2 ** 20);
      continue;
    }
    // Bit 15 set: the size is in KiB, else in MiB.
    sizes.push(size & 0x8000 ? (size & 0x7fff) * 1024 : size * 2 ** 20);
  }
  return sizes;
}
