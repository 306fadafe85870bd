/**
 * Encodes SMBIOS structures (DMTF DSP0134) as firmware lays them out in
 * /sys/firmware/dmi/tables/DMI, for fixtures: formatted area, then strings.
 */

/** One structure: its type, handle, the formatted area after the 4-byte header, and its strings. */
export function smbiosStructure(type: number, handle: number, fields: Buffer, strings: readonly string[] = []): Buffer {
  const header = Buffer.from([type, 4 + fields.length, handle & 0xff, handle >> 8]);
  const text =
    strings.length === 0
      ? Buffer.alloc(2)
      : Buffer.concat([...strings.map((s) => Buffer.from(`${s}\0`, 'latin1')), Buffer.alloc(1)]);
  return Buffer.concat([header, fields, text]);
}

/** BIOS information (type 0), SMBIOS 2.4 layout (0x18 bytes); `uefi` sets Extension Byte 2's bit 3. */
export function biosInformation(uefi: boolean): Buffer {
  const fields = Buffer.alloc(0x18 - 4);
  fields[0x04 - 4] = 1; // vendor: string 1
  fields[0x05 - 4] = 2; // version: string 2
  fields[0x13 - 4] = uefi ? 0x08 : 0;
  return smbiosStructure(0, 0x0000, fields, ['Dell Inc.', '2.17.1']);
}

/** System information (type 1), SMBIOS 2.4 layout (0x1B bytes). */
export function systemInformation(manufacturer: string, product: string, serial: string): Buffer {
  const fields = Buffer.alloc(0x1b - 4);
  fields[0x04 - 4] = 1;
  fields[0x05 - 4] = 2;
  fields[0x06 - 4] = 0; // version: none
  fields[0x07 - 4] = 3;
  return smbiosStructure(1, 0x0100, fields, [manufacturer, product, serial]);
}

/**
 * A memory device (type 17), SMBIOS 3.2 layout (0x54 bytes): `size` as the
 * Size word (0 for an empty slot, bit 15 for KiB, 0x7FFF for the extended
 * size), `extendedMiB` the Extended Size, `technology` the Memory Technology.
 */
export function memoryDevice(
  handle: number,
  size: number,
  options: { extendedMiB?: number; technology?: number } = {},
): Buffer {
  const fields = Buffer.alloc(0x54 - 4);
  fields.writeUInt16LE(size, 0x0c - 4);
  fields.writeUInt32LE(options.extendedMiB ?? 0, 0x1c - 4);
  fields[0x28 - 4] = options.technology ?? 0x03;
  fields[0x10 - 4] = 1; // device locator: string 1
  return smbiosStructure(17, handle, fields, [`A${handle & 0xff}`]);
}

/** End of table (type 127). */
export function endOfTable(): Buffer {
  return smbiosStructure(127, 0xfeff, Buffer.alloc(0));
}
