/** The RMCP+ UDP port of a BMC that names none. */
export const IPMI_DEFAULT_PORT = 623;
/** The cipher suite of a BMC that names none: 17 (HMAC-SHA256, AES-CBC-128), as current BMCs offer. */
export const IPMI_DEFAULT_CIPHER_SUITE = 17;

/** An IPMI BMC to talk to, and the credentials for it. */
export interface IpmiTarget {
  /** The machine's name in messages and logs (its provider ID). */
  readonly machine: string;
  /** The BMC's address or host name. */
  readonly host: string;
  /** RMCP+ UDP port. Default 623. */
  readonly port?: number | undefined;
  readonly username: string;
  readonly password: Secret;
  /**
   * RMCP+ cipher suite (`ipmitool -C`). Default 17 (HMAC-SHA256, AES-CBC-128),
   * as current BMCs offer; older ones and OpenIPMI's `ipmi_sim` speak 3.
   */
  readonly cipherSuite?: number | undefined;
}

/** The BMC as named in messages: `host:port`. */
export function bmcName(target: Pick<IpmiTarget, 'host' | 'port'>): string {
  const host = target.host.includes(':') ? `[${target.host}]` : target.host;
  return `${host}:${target.port ?? IPMI_DEFAULT_PORT}`;
}

import type { Secret } from '@bmaas/common';
