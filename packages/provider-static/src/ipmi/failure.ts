// What a failed ipmitool run means, read from its verbose output.

/** The cause of a failed run, as far as ipmitool's words tell. */
export type IpmiFailureKind = 'credentials' | 'unreachable' | 'unanswered' | 'unsupported' | 'other';

export interface IpmiFailure {
  readonly kind: IpmiFailureKind;
  /** The line(s) that tell, for the operator. */
  readonly detail: string;
  /**
   * Whether the command may have reached the BMC: false only when no session
   * was set up (nothing answered, the name did not resolve, the credentials
   * were refused), so nothing was asked of it.
   */
  readonly sent: boolean;
}

/** Lines `-v` prints on every run, failed or not: probes of optional features. */
const NOISE = [
  /^Loading IANA PEN Registry/,
  /^Running Get VSO Capabilities/,
  /^Invalid completion code received/,
  /^Discovered IPMB address/,
  /^Get HPM\.x Capabilities request failed/,
  /^Using best available cipher suite/,
];

/** Completion codes and messages that say the BMC does not do what was asked. */
const UNSUPPORTED_REASON =
  /invalid command|invalid data field in request|not supported|command not available|parameter not supported|request data length invalid/i;
const CREDENTIALS_REASON = /insufficient privilege|privilege level|unauthorized|authentication/i;
/** Session set-up failures (RAKP) that mean the user or password was refused. */
const CREDENTIALS =
  /RAKP 2 HMAC is invalid|RAKP \d message indicates an error : (unauthorized name|invalid role|inactive session|invalid name length|unauthorized role|invalid integrity check)|invalid user ?name|invalid password|password invalid/i;
/** The BMC offers none of the algorithms of the asked cipher suite. */
const CIPHER =
  /invalid (authentication|integrity|confidentiality) algorithm|no matching cipher suite|unable to find matching cipher|cipher suite .* not supported/i;
/** Nothing answered, or the name does not resolve. */
const UNREACHABLE =
  /Get Auth Capabilities error|Error issuing Get Channel Authentication Capabilities|No response from remote controller|no response from RAKP|Address lookup for .* failed|Could not open socket|Insufficient resources for session/i;

/** A session set up, then no answer to the command: ipmitool's "Unable to set Chassis Power Control to Reset". */
const UNANSWERED = /^Unable to (?!establish)/i;
/** The session was never set up: ipmitool stopped before asking anything of the BMC. */
const NO_SESSION = /Unable to establish IPMI v2 \/ RMCP\+ session/i;

/**
 * Reads a failed run's stderr. A command that failed says so on a line
 * `<what> failed: <reason>` and the reason decides; a session that could
 * not be set up leaves the RAKP or capabilities error before "Unable to
 * establish IPMI v2 / RMCP+ session".
 */
export function classifyFailure(stderr: string, cipherSuite: number): IpmiFailure {
  const lines = stderr
    .split(/\r?\n/)
    .map((line) => line.replace(/^>\s*/, '').trim())
    .filter((line) => line !== '' && !NOISE.some((noise) => noise.test(line)));
  const sent = !NO_SESSION.test(lines.join('\n'));
  return { ...reading(lines, cipherSuite), sent };
}

function reading(lines: readonly string[], cipherSuite: number): Omit<IpmiFailure, 'sent'> {
  const failed = lines.findLast((line) => / failed: /.test(line));
  if (failed !== undefined) {
    const reason = failed.slice(failed.lastIndexOf(' failed: ') + ' failed: '.length);
    if (UNSUPPORTED_REASON.test(reason)) return { kind: 'unsupported', detail: failed };
    if (CREDENTIALS_REASON.test(reason)) return { kind: 'credentials', detail: failed };
    return { kind: 'other', detail: failed };
  }
  const text = lines.join('\n');
  const credentials = lines.find((line) => CREDENTIALS.test(line));
  if (credentials !== undefined) {
    return { kind: 'credentials', detail: `the BMC refused the user name or password (${credentials})` };
  }
  const cipher = lines.find((line) => CIPHER.test(line));
  if (cipher !== undefined) {
    return {
      kind: 'unsupported',
      detail: `the BMC does not offer cipher suite ${cipherSuite} (${cipher}); set bmc.cipherSuite to one it offers (3 on older BMCs)`,
    };
  }
  const unreachable = lines.find((line) => UNREACHABLE.test(line));
  if (unreachable !== undefined) return { kind: 'unreachable', detail: `no answer from the BMC (${unreachable})` };
  if (NO_SESSION.test(text)) {
    return { kind: 'unreachable', detail: 'no RMCP+ session could be set up (no answer from the BMC)' };
  }
  const unanswered = lines.find((line) => UNANSWERED.test(line));
  if (unanswered !== undefined) return { kind: 'unanswered', detail: `no answer to the command (${unanswered})` };
  return { kind: 'other', detail: lines.slice(-3).join('; ') || 'ipmitool failed without a message' };
}
