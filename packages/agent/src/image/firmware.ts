// The firmware the image's drivers declare (MODULE_FIRMWARE), found on the build host or not.
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { AgentImageError } from './errors.js';

/** Where Debian's firmware packages put their files, and where the kernel looks for them. */
export const FIRMWARE_DIR = '/lib/firmware';

/**
 * The suffixes the kernel reads a firmware file under: as declared, or
 * xz-compressed (`CONFIG_FW_LOADER_COMPRESS_XZ`, on in Debian's kernel).
 */
const FIRMWARE_SUFFIXES = ['', '.xz'] as const;

/** A declared firmware file the build host does not have. */
export interface MissingFirmware {
  /** The module declaring it (`bnx2x`). */
  readonly module: string;
  /** Its path under the firmware directory, as declared (`bnx2x/bnx2x-e2-7.13.21.0.fw`). */
  readonly firmware: string;
}

/** The firmware files of the image's drivers: those found, and those declared but missing. */
export interface ImageFirmware {
  /** Files found, by their path under the firmware directory (with `.xz` where that is how it was found). */
  readonly found: readonly { readonly name: string; readonly source: string }[];
  readonly missing: readonly MissingFirmware[];
}

/**
 * The firmware a kernel module declares: the `firmware=` entries of its
 * ELF `.modinfo` section (what `modinfo -F firmware` prints), in order.
 *
 * @throws {@link AgentImageError} naming the module when it is no 64-bit little-endian ELF file
 */
export function declaredFirmware(module: Buffer, name: string): string[] {
  const elf = module.length >= 64 && module.readUInt32BE(0) === 0x7f454c46;
  if (!elf || module[4] !== 2 || module[5] !== 1) {
    throw new AgentImageError(`module ${name}: not a 64-bit little-endian ELF file`);
  }
  const sectionsAt = Number(module.readBigUInt64LE(0x28));
  const entrySize = module.readUInt16LE(0x3a);
  const count = module.readUInt16LE(0x3c);
  const namesIndex = module.readUInt16LE(0x3e);
  const section = (index: number) => {
    const at = sectionsAt + index * entrySize;
    return {
      name: module.readUInt32LE(at),
      offset: Number(module.readBigUInt64LE(at + 0x18)),
      size: Number(module.readBigUInt64LE(at + 0x20)),
    };
  };
  const names = section(namesIndex);
  for (let i = 0; i < count; i++) {
    const s = section(i);
    const nameEnd = module.indexOf(0, names.offset + s.name);
    if (module.toString('latin1', names.offset + s.name, nameEnd) !== '.modinfo') continue;
    return module
      .toString('latin1', s.offset, s.offset + s.size)
      .split('\0')
      .filter((entry) => entry.startsWith('firmware='))
      .map((entry) => entry.slice('firmware='.length));
  }
  return [];
}

/**
 * Looks up each module's declared firmware under `firmwareDir`, as the
 * kernel would: the file as named, else its `.xz`.
 *
 * @param declared - each module's name and the firmware it declares
 */
export async function findFirmware(
  firmwareDir: string,
  declared: readonly { readonly module: string; readonly firmware: readonly string[] }[],
): Promise<ImageFirmware> {
  const found = new Map<string, string>();
  const missing: MissingFirmware[] = [];
  for (const { module, firmware } of declared) {
    for (const file of firmware) {
      let present = false;
      for (const suffix of FIRMWARE_SUFFIXES) {
        const name = `${file}${suffix}`;
        const source = path.join(firmwareDir, name);
        // A link (Debian's firmware packages have many) counts as the file it points to.
        if (
          await stat(source).then(
            (s) => s.isFile(),
            () => false,
          )
        ) {
          found.set(name, source);
          present = true;
          break;
        }
      }
      if (!present) missing.push({ module, firmware: file });
    }
  }
  return {
    found: [...found].map(([name, source]) => ({ name, source })).sort((a, b) => a.name.localeCompare(b.name)),
    missing,
  };
}
