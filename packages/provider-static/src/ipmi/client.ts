import { retry, Semaphore } from '@bmaas/common';
import { PowerOutcomeUnknownError } from '@bmaas/shepherd-manager';
import {
  BmcCredentialsError,
  type BmcError,
  BmcTimeoutError,
  BmcUnreachableError,
  BmcUnsupportedError,
  IpmiCommandError,
} from '../errors.js';
import { log } from '../internal/log.js';
import { type IpmiClientOptions, type IpmiClientSettings, ipmiClientSettings } from './client-settings.js';
import { classifyFailure } from './failure.js';
import { runIpmitool } from './ipmitool.js';
import { bmcName, IPMI_DEFAULT_CIPHER_SUITE, type IpmiTarget } from './target.js';

/** Chassis power as IPMI reports it: on or off, nothing in between. */
export type IpmiPowerState = 'On' | 'Off';

/** `chassis power` actions, as ipmitool names them. */
export type IpmiPowerAction =
  /** Power up. */
  | 'on'
  /** Power down at once (hard). */
  | 'off'
  /** ACPI soft shutdown: the OS is asked to power off (graceful). */
  | 'soft'
  /** Power down, then up after the BMC's interval. */
  | 'cycle'
  /** Hard reset: the machine restarts at once, power stays on. */
  | 'reset';

/**
 * Actions that act again when sent twice (a second reset restarts the
 * machine again): ipmitool sends them once (`-R 1`), and a run is repeated
 * only when no session was set up. `on`, `off` and `soft` leave the machine
 * as one did.
 */
const ACTS_TWICE: ReadonlySet<IpmiPowerAction> = new Set(['reset', 'cycle']);

/** Boot devices of `chassis bootdev`. */
export const IPMI_BOOT_DEVICES = ['none', 'pxe', 'disk', 'cdrom', 'bios', 'safe', 'diag', 'floppy'] as const;
export type IpmiBootDevice = (typeof IPMI_BOOT_DEVICES)[number];

/**
 * An IPMI client over Debian's `ipmitool` (`-I lanplus`, IPMI 2.0 RMCP+),
 * the tool Ironic's IPMI driver runs: chassis power status and control, and
 * the boot device. Each command is one ipmitool run with a timeout (the child
 * killed after it), retried with jitter when the BMC did not answer (never
 * when it refused the credentials or the command), under a bound on commands
 * in flight across the fleet. The password reaches ipmitool through its
 * environment alone (see `runIpmitool`).
 *
 * @example
 * ```ts
 * const ipmi = new IpmiClient({ timeout: 20_000 });
 * const bmc = { machine: 'node07', host: '10.1.7.7', username: 'admin', password: new Secret(secret) };
 * if ((await ipmi.powerState(bmc)) === 'Off') await ipmi.power(bmc, 'on');
 * else await ipmi.power(bmc, 'reset');
 * ```
 */
export class IpmiClient {
  readonly settings: IpmiClientSettings;
  readonly #slots: Semaphore;

  constructor(options: IpmiClientOptions = {}) {
    this.settings = ipmiClientSettings(options);
    this.#slots = new Semaphore(this.settings.concurrency);
  }

  /**
   * Reads the chassis power state (`chassis power status`).
   *
   * @throws {@link BmcError} subclasses naming the machine and cause
   * @throws {@link IpmitoolMissingError} without ipmitool
   */
  async powerState(target: IpmiTarget, signal?: AbortSignal): Promise<IpmiPowerState> {
    const stdout = await this.#command(target, ['chassis', 'power', 'status'], signal);
    const match = /Chassis Power is (on|off)/i.exec(stdout);
    if (!match) {
      throw new IpmiCommandError(
        target.machine,
        bmcName(target),
        'chassis power status',
        `unexpected answer ${JSON.stringify(stdout.trim().slice(0, 200))}`,
      );
    }
    return match[1]?.toLowerCase() === 'on' ? 'On' : 'Off';
  }

  /**
   * `chassis power <action>`: resolves once the BMC accepted it (the machine
   * may take a while to get there). A `reset` or `cycle` goes out once: if
   * its answer does not come, the BMC may have acted, and another would
   * reset the machine twice.
   *
   * @throws {@link BmcError} subclasses naming the machine and cause
   * @throws {@link PowerOutcomeUnknownError} for a reset or cycle sent and not answered (in time)
   * @throws {@link IpmitoolMissingError} without ipmitool
   */
  async power(target: IpmiTarget, action: IpmiPowerAction, signal?: AbortSignal): Promise<void> {
    await this.#command(target, ['chassis', 'power', action], signal, ACTS_TWICE.has(action));
    log.ipmi('machine %s: chassis power %s accepted by %s', target.machine, action, bmcName(target));
  }

  /**
   * `chassis bootdev <device>`: the device the next boot (or every boot,
   * `persistent`) starts from; `efiboot` asks for UEFI rather than legacy boot.
   */
  async setBootDevice(
    target: IpmiTarget,
    device: IpmiBootDevice,
    options: { persistent?: boolean; efiboot?: boolean } = {},
    signal?: AbortSignal,
  ): Promise<void> {
    if (!(IPMI_BOOT_DEVICES as readonly string[]).includes(device)) {
      throw new RangeError(`IpmiClient: boot device must be one of ${IPMI_BOOT_DEVICES.join(', ')}, got ${device}`);
    }
    const flags = [options.persistent ? 'persistent' : undefined, options.efiboot ? 'efiboot' : undefined].filter(
      (flag) => flag !== undefined,
    );
    await this.#command(
      target,
      ['chassis', 'bootdev', device, ...(flags.length > 0 ? [`options=${flags.join(',')}`] : [])],
      signal,
    );
    log.ipmi('machine %s: boot device %s set on %s', target.machine, device, bmcName(target));
  }

  /**
   * The device the next boot starts from, as the BMC reads back its boot
   * flags (`chassis bootparam get 5`): ipmitool's words after "Boot Device
   * Selector", e.g. `Force PXE`, `Force Boot from default Hard-Drive`.
   *
   * @throws {@link IpmiCommandError} when the answer has no boot device selector
   */
  async nextBootDevice(target: IpmiTarget, signal?: AbortSignal): Promise<string> {
    const stdout = await this.#command(target, ['chassis', 'bootparam', 'get', '5'], signal);
    const selector = /Boot Device Selector\s*:\s*(.+)/.exec(stdout)?.[1]?.trim();
    if (selector === undefined) {
      throw new IpmiCommandError(
        target.machine,
        bmcName(target),
        'chassis bootparam get 5',
        `no boot device selector in the answer ${JSON.stringify(stdout.trim().slice(0, 200))}`,
      );
    }
    return selector;
  }

  /**
   * One command under the fleet-wide bound, with retries; resolves with
   * ipmitool's stdout. A command that `actsTwice` is sent once per run and
   * run again only when no session was set up.
   */
  async #command(
    target: IpmiTarget,
    command: readonly string[],
    signal: AbortSignal | undefined,
    actsTwice = false,
  ): Promise<string> {
    const release = await this.#slots.acquire(signal);
    try {
      return await retry(() => this.#attempt(target, command, signal, actsTwice), {
        maxAttempts: this.settings.maxAttempts,
        baseDelay: this.settings.retryDelay,
        // No answer: another try may get one. A refusal says the same again.
        retryable: (error) => error instanceof BmcTimeoutError || error instanceof BmcUnreachableError,
        onRetry: (error, attempt, pause) =>
          log.ipmi(
            'machine %s: %s failed (%s); attempt %d of %d in %d ms',
            target.machine,
            command.join(' '),
            (error as Error).message,
            attempt + 1,
            this.settings.maxAttempts,
            pause,
          ),
        signal,
      });
    } finally {
      release();
    }
  }

  async #attempt(
    target: IpmiTarget,
    command: readonly string[],
    signal: AbortSignal | undefined,
    actsTwice: boolean,
  ): Promise<string> {
    const bmc = bmcName(target);
    const what = command.join(' ');
    // ipmitool's own retransmissions of the command are acts too: ipmi_sim resets once for each.
    const settings = actsTwice ? { ...this.settings, messageRetries: 1 } : this.settings;
    const output = await runIpmitool(settings, target, command, signal);
    const scrubbed = target.password.scrub(output.stderr);
    const failure =
      output.code === 0 && !output.timedOut
        ? undefined
        : classifyFailure(scrubbed, target.cipherSuite ?? IPMI_DEFAULT_CIPHER_SUITE);
    if (output.timedOut) {
      const error = new BmcTimeoutError(target.machine, 'ipmi', bmc, what, this.settings.timeout);
      if (actsTwice && failure?.sent !== false) throw new PowerOutcomeUnknownError(target.machine, what, error);
      throw error;
    }
    if (failure === undefined) return output.stdout;
    const problem = `${what}: ${failure.detail}`;
    switch (failure.kind) {
      case 'credentials':
        throw new BmcCredentialsError(
          target.machine,
          'ipmi',
          bmc,
          `${problem}; user ${JSON.stringify(target.username)} (credentials refused)`,
          target.username,
        );
      case 'unreachable':
      case 'unanswered': {
        const error = new BmcUnreachableError(target.machine, 'ipmi', bmc, problem);
        if (actsTwice && failure.sent) throw new PowerOutcomeUnknownError(target.machine, what, error);
        throw error;
      }
      case 'unsupported':
        throw new BmcUnsupportedError(target.machine, 'ipmi', bmc, `${problem} (not supported)`);
      default:
        throw new IpmiCommandError(target.machine, bmc, what, failure.detail);
    }
  }
}
