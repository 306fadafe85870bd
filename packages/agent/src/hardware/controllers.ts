import { linkName, listNames, readText } from './files.js';

/** What a controller is for, by its PCI base class: 01 mass storage, 02 network. */
export type ControllerKind = 'storage' | 'network';

const KINDS: Record<string, ControllerKind> = { '01': 'storage', '02': 'network' };

/** A PCI storage or network controller, from /sys/bus/pci/devices. */
export interface ControllerRecord {
  /** Its PCI address, `0000:18:00.0`. */
  readonly address: string;
  readonly kind: ControllerKind;
  /** Its PCI vendor and device IDs as lspci prints them, `1000:005d`. */
  readonly pciId: string;
  /** Its class and subclass as lspci prints them, `0104` (a RAID controller). */
  readonly pciClass: string;
  /** The kernel driver bound to it (megaraid_sas, ice), or '' when none is. */
  readonly driver: string;
}

/** A hex ID of sysfs (`0x1000`, `0x010400`) without its 0x, lower-case; '' where unreadable. */
function hex(text: string | undefined): string {
  return (text ?? '').replace(/^0x/i, '').toLowerCase();
}

/** The machine's PCI storage and network controllers under `root`, in address order. */
export async function readControllers(root: string): Promise<ControllerRecord[]> {
  const controllers: ControllerRecord[] = [];
  for (const address of await listNames(root, 'sys/bus/pci/devices')) {
    const dir = `sys/bus/pci/devices/${address}`;
    const pciClass = hex(await readText(root, `${dir}/class`));
    const kind = KINDS[pciClass.slice(0, 2)];
    if (kind === undefined) continue;
    controllers.push({
      address,
      kind,
      pciId: `${hex(await readText(root, `${dir}/vendor`))}:${hex(await readText(root, `${dir}/device`))}`,
      pciClass: pciClass.slice(0, 4),
      driver: (await linkName(root, `${dir}/driver`)) ?? '',
    });
  }
  return controllers;
}

/**
 * Why a controller without a driver matters, for the report's warnings and
 * a wipe's refusal: what is behind it is not seen.
 */
export function driverlessMessage(controller: ControllerRecord): string {
  const behind = controller.kind === 'storage' ? 'the disks behind it are not seen' : 'its NICs are not seen';
  return `${controller.kind} controller ${controller.address} (PCI ID ${controller.pciId}, class ${controller.pciClass}) has no driver bound: ${behind}`;
}
