/** A BMC to talk to: one machine's ComputerSystem and the credentials for it. */
export interface RedfishTarget {
  /** The machine's name in messages and logs (its provider ID). */
  readonly machine: string;
  /** The ComputerSystem resource, `https://bmc/redfish/v1/Systems/1`. */
  readonly url: string;
  readonly username: string;
  readonly password: Secret;
  /** Skip TLS certificate verification (logged once per machine). */
  readonly insecure?: boolean | undefined;
}

import type { Secret } from '@bmaas/common';
