// The iPXE scripts of a network boot, and the MAC addresses they are matched by.

/** A MAC address as iPXE's `${net0/mac}` gives it (`52:54:00:12:34:56`), or with dashes, in either case. */
const MAC = /^[0-9a-f]{2}([:-])[0-9a-f]{2}(\1[0-9a-f]{2}){4}$/i;

/** `mac` in the form the shepherd keeps (lower case, colons), or undefined when it is not a MAC address. */
export function normalizeMac(mac: string): string | undefined {
  return MAC.test(mac) ? mac.toLowerCase().replaceAll('-', ':') : undefined;
}

/** Where a network boot's files are, as the machine fetches them. */
export interface NetworkBootUrls {
  readonly kernel: string;
  readonly initramfs: string;
  /** This boot's config initramfs (the enrollment token's), loaded after the image's. */
  readonly config: string;
}

/** The script that boots the agent: the image's kernel and initramfs, then this boot's config. */
export function agentBootScript(urls: NetworkBootUrls, kernelArguments: string): string {
  return [
    '#!ipxe',
    `kernel ${urls.kernel} ${kernelArguments}`,
    `initrd ${urls.initramfs}`,
    `initrd ${urls.config}`,
    'boot',
    '',
  ].join('\n');
}

/**
 * The script for a machine the shepherd boots nothing on: it says why on the
 * machine's console and exits, so the firmware goes on to its next boot device.
 * `reason` is this module's own text (never a request's): iPXE expands `${...}`.
 */
export function noAgentBootScript(reason: string): string {
  return ['#!ipxe', `echo BMaaS shepherd: ${reason}`, 'exit 1', ''].join('\n');
}
