import { Semaphore } from '@bmaas/shepherd-manager';
import {
  IpmiCommandError,
  IpmiCredentialsError,
  type IpmiError,
  IpmiTimeoutError,
  IpmiUnreachableError,
  IpmiUnsupportedError,
} from '../errors.js';
import { log } from '../internal/log.js';
import { RetryableError, withRetries } from '../internal/retry.js';
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
   * @throws {@link IpmiError} subclasses naming the machine and cause
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
   * may take a while to get there).
   *
   * @throws {@link IpmiError} subclasses naming the machine and cause
   * @throws {@link IpmitoolMissingError} without ipmitool
   */
  async power(target: IpmiTarget, action: IpmiPowerAction, signal?: AbortSignal): Promise<void> {
    await this.#command(target, ['chassis', 'power', action], signal);
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

  /** One command under the fleet-wide bound, with retries; resolves with ipmitool's stdout. */
  async #command(target: IpmiTarget, command: readonly string[], signal: AbortSignal | undefined): Promise<string> {
    const release = await this.#slots.acquire(signal);
    try {
      return await withRetries(
        this.settings,
        async () => {
          const outcome = await this.#attempt(target, command, signal);
          if (typeof outcome === 'string') return outcome;
          throw outcome.retry ? new RetryableError(outcome.error) : outcome.error;
        },
        (failure, next, pause) =>
          log.ipmi(
            'machine %s: %s failed (%s); attempt %d of %d in %d ms',
            target.machine,
            command.join(' '),
            failure.message,
            next,
            this.settings.maxAttempts,
            pause,
          ),
        signal,
      );
    } finally {
      release();
    }
  }

  async #attempt(
    target: IpmiTarget,
    command: readonly string[],
    signal: AbortSignal | undefined,
  ): Promise<string | { error: IpmiError; retry: boolean }> {
    const bmc = bmcName(target);
    const what = command.join(' ');
    const output = await runIpmitool(this.settings, target, command, signal);
    if (output.timedOut) {
      return { error: new IpmiTimeoutError(target.machine, bmc, what, this.settings.timeout), retry: true };
    }
    if (output.code === 0) return output.stdout;
    const failure = classifyFailure(
      target.password.scrub(output.stderr),
      target.cipherSuite ?? IPMI_DEFAULT_CIPHER_SUITE,
    );
    const problem = `${what}: ${failure.detail}`;
    switch (failure.kind) {
      case 'credentials':
        return {
          error: new IpmiCredentialsError(
            target.machine,
            bmc,
            `${problem}; user ${JSON.stringify(target.username)} (credentials refused)`,
          ),
          retry: false,
        };
      case 'unreachable':
        return { error: new IpmiUnreachableError(target.machine, bmc, problem), retry: true };
      case 'unsupported':
        return { error: new IpmiUnsupportedError(target.machine, bmc, `${problem} (not supported)`), retry: false };
      default:
        return { error: new IpmiCommandError(target.machine, bmc, what, failure.detail), retry: false };
    }
  }
}
