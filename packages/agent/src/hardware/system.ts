import { exists, readBytes, readText } from './files.js';
import { parseSmbiosTable, type SmbiosStructure, smbiosSystem, smbiosUefiSupported } from './smbios.js';

/** How the running kernel was booted, and what the firmware says of EFI. */
export type EfiSupport = 'unknown' | 'unsupported' | 'supported' | 'enabled';

/** The machine as DMI names it, and how it booted. */
export interface SystemRecord {
  readonly manufacturer: string;
  readonly product: string;
  readonly serialNumber: string;
  /** `uefi` when the kernel was booted by UEFI (/sys/firmware/efi exists), else `bios`. */
  readonly bootMode: 'uefi' | 'bios';
  /**
   * `enabled` when EFI runtime services work (/sys/firmware/efi/runtime);
   * else what SMBIOS says the firmware supports; `unknown` when neither says.
   */
  readonly efiSupport: EfiSupport;
}

export const SMBIOS_TABLE = 'sys/firmware/dmi/tables/DMI';

/**
 * The SMBIOS structures of the machine under `root`, or undefined (with a
 * warning) when the table cannot be read (it is readable by root only) or
 * parsed.
 */
export async function readSmbios(root: string, warnings: string[]): Promise<SmbiosStructure[] | undefined> {
  const table = await readBytes(root, SMBIOS_TABLE);
  if (table === undefined) {
    warnings.push(`SMBIOS table /${SMBIOS_TABLE} unreadable: DMI names from /sys/class/dmi/id, memory from sysfs`);
    return undefined;
  }
  try {
    return parseSmbiosTable(table);
  } catch (error) {
    warnings.push(`SMBIOS table /${SMBIOS_TABLE} unparseable: ${(error as Error).message}`);
    return undefined;
  }
}

/** The machine's DMI names (SMBIOS type 1, else /sys/class/dmi/id) and its boot mode. */
export async function readSystem(root: string, smbios: readonly SmbiosStructure[] | undefined): Promise<SystemRecord> {
  const fromTable = smbios && smbiosSystem(smbios);
  const names = fromTable ?? {
    manufacturer: (await readText(root, 'sys/class/dmi/id/sys_vendor')) ?? '',
    product: (await readText(root, 'sys/class/dmi/id/product_name')) ?? '',
    serialNumber: (await readText(root, 'sys/class/dmi/id/product_serial')) ?? '',
  };
  const uefi = await exists(root, 'sys/firmware/efi');
  const supported = smbios && smbiosUefiSupported(smbios);
  const efiSupport: EfiSupport = (await exists(root, 'sys/firmware/efi/runtime'))
    ? 'enabled'
    : supported === undefined
      ? 'unknown'
      : supported
        ? 'supported'
        : 'unsupported';
  return { ...names, bootMode: uefi ? 'uefi' : 'bios', efiSupport };
}
